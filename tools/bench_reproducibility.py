"""Benchmark: what the reproducibility switch costs (palaestra.shared.reproducibility).

One workload, timed in fresh processes with the switch on and off (its variables must be set before torch
loads), interleaved on/off in the same run, ``--repeats`` times (at least 5). The workload is `tiny`'s: SFT steps
(forward, backward, AdamW) on a fixed batch, then a greedy generate call. Prints seconds per workload as
median [min-max] for each arm, the ratio on / off of the medians, and whether the two arms' final weights agree
(they need not: the switch picks other kernels).

    .venv/bin/python tools/bench_reproducibility.py
    .venv/bin/python tools/bench_reproducibility.py --repeats 7 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchstats import REPEATS, median, spread

WORKLOAD = """
import hashlib, json, sys, time
from palaestra.shared import reproducibility
reproducibility.apply_env()
import torch
from transformers import AutoModelForCausalLM
from palaestra.shared.llm.tiny import tiny_path
reproducibility.apply_torch(1)
steps, batch, length = (int(a) for a in sys.argv[1:4])
model = AutoModelForCausalLM.from_pretrained(tiny_path(0))
gen = torch.Generator().manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=gen)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
start = time.perf_counter()
model.train()
for _ in range(steps):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
model.eval()
with torch.no_grad():
    model.generate(ids[:4, :16], max_new_tokens=32, do_sample=False)
seconds = time.perf_counter() - start
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print(json.dumps({"seconds": seconds, "digest": digest[:16], "capability": torch.backends.cpu.get_cpu_capability()}))
"""


def measure(switch: bool, steps: int, batch: int, length: int) -> dict:
    env = {**os.environ, "PALAESTRA_REPRODUCIBLE": "1" if switch else "0"}
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"):  # each arm sets its own
        env.pop(name, None)
    env.setdefault("OMP_NUM_THREADS", "1")  # the off arm: one thread too, so only the kernels differ
    args = [sys.executable, "-c", WORKLOAD, str(steps), str(batch), str(length)]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error(f"at least 5 repeats, not {args.repeats}")
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.repeats):
        for switch in (False, True):  # interleaved, so a change in the machine's load hits both arms
            runs[switch].append(measure(switch, args.steps, args.batch, args.length))
    for switch, label in ((False, "off"), (True, "on")):
        seconds = [r["seconds"] for r in runs[switch]]
        digests = {r["digest"] for r in runs[switch]}
        capability = runs[switch][0]["capability"]
        print(f"switch {label:3s}: {spread(seconds, '.2f')} s  (kernels {capability}; digests {sorted(digests)})")
    ratio = median([r["seconds"] for r in runs[True]]) / median([r["seconds"] for r in runs[False]])
    print(f"cost: on / off = {ratio:.2f} (median seconds, {args.repeats} repeats each, same run)")


if __name__ == "__main__":
    main()
