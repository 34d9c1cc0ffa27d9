"""Benchmark of bounded-staleness rollouts: the synchronous loop vs ``rollout.max_staleness`` 1 and 2.

The same task (experiments/shared/toy_rl.yaml: `tiny`, 2 Ray rollout workers and the learner in this
process; no SFT warm-up and no evaluation, which do not change a step's cost) is trained for
``--warmup`` + ``--steps`` steps at each staleness. Per measured step, in the same run:

- ``step``: the trainer step's wall time (``perf/step_s``);
- ``rollout``: the wall time of that step's rollout on the workers (its slowest shard, ``rollout_s``);
- ``learner``: the learner's share of the step (the step less its wait for the rollout: scoring,
  advantages, the PPO update, the weight sync);
- ``ratio``: step / max(rollout, learner): 1 is a perfect overlap, rollout + learner over their maximum
  is no overlap (the synchronous loop).

Each figure is the median [min-max] over the measured steps (at least 5); ``speedup`` is the synchronous
run's median step over this run's.

    .venv/bin/python tools/bench_async.py [--steps 5] [--warmup 2] [--staleness 0 1 2] [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchstats import REPEATS, spread

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "shared" / "toy_rl.yaml"


def run(k: int, args) -> dict[str, list[float]]:
    """The measured steps' figures at staleness `k`."""
    import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)
    from palaestra.shared.jobs import load_config
    from palaestra.shared.rl.trainer import Trainer

    overrides = [
        f"output_dir={tempfile.mkdtemp()}",
        "tracking.enabled=false",
        "sft_warmup.steps=0",
        "eval_tasks=0",
        "log_samples=0",
        f"steps={args.warmup + args.steps}",
        f"rollout.max_staleness={k}",
        *args.overrides,
    ]
    cfg = load_config(CONFIG, overrides)
    figures: dict[str, list[float]] = {"step": [], "rollout": [], "learner": []}
    with Trainer(cfg) as trainer:
        trainer.prepare()
        assert trainer.stream is not None
        take, last = trainer.stream.take, {}

        def timed_take(step: int):
            t0 = time.perf_counter()
            result = take(step)
            last["wait"], last["rollout"] = time.perf_counter() - t0, result.stats["rollout_s"]
            return result

        trainer.stream.take = timed_take  # type: ignore[method-assign]
        for step in range(args.warmup + args.steps):
            metrics = trainer.train_step()
            if step >= args.warmup:
                figures["step"].append(metrics["perf/step_s"])
                figures["rollout"].append(last["rollout"])
                figures["learner"].append(metrics["perf/step_s"] - last["wait"])
    figures["ratio"] = [s / max(r, u) for s, r, u in zip(figures["step"], figures["rollout"], figures["learner"])]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=REPEATS, help="measured steps per setting (>= 5)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (the pipeline fills)")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of toy_rl.yaml")
    args = parser.parse_args()
    if args.steps < REPEATS:
        parser.error(f"--steps must be >= {REPEATS}")
    import torch

    torch.set_num_threads(1)
    rows = {k: run(k, args) for k in args.staleness}
    base = statistics.median(rows[args.staleness[0]]["step"])
    print(f"\nmedian [min-max] of {args.steps} steps after {args.warmup} warm-up steps")
    print("| max_staleness | step s | rollout s | learner s | step / max(rollout, learner) | speedup |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k, f in rows.items():
        speedup = base / statistics.median(f["step"])
        cells = [spread(f[n], ".2f") for n in ("step", "rollout", "learner", "ratio")]
        print(f"| {k} | " + " | ".join(cells) + f" | {speedup:.2f}x |")


if __name__ == "__main__":
    main()
