"""Whether a training config's tasks carry signal for its starting policy: its pilot pass alone (rl/pilot.py),
then the share of mixed groups and what the pass cost, extrapolated to the config's whole matrix.

    python packages/egpo/scripts/pilot_signal.py experiments/egpo/egpo_vs_grpo.yaml [key=value ...]
    # e.g. pilot.candidates=4 pilot.cache=/tmp/pilot4.jsonl  (a handful first: the cost per task)

The config's ``matrix`` is set aside (the pass is the same for every run when ``pilot.seed`` is set); the pass
runs exactly as the trainer runs it before its first step (`Trainer.prepare`), with tracking off, and writes the
config's ``pilot.cache``. Prints per-task verdicts (mixed, all 0, all equal non-zero, no usable answer), the share
mixed with its 95% Wilson interval, the process CPU seconds per task and per sample, and the demonstration's
sampling cost in samples (pilot + every run's steps x tasks x group + its evaluation entries) at that rate.
Updates are not in the pass: their cost is added from a stated per-step figure (``--update-cpu-s``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path

from palaestra.shared.jobs import load_config, read_yaml
from palaestra.shared.stats import wilson_interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--update-cpu-s", type=float, default=0.0, help="CPU seconds of one update step (estimate)")
    parser.add_argument("--report-only", action="store_true", help="no pass: report what the cache holds")
    parser.add_argument("--cpu-s", type=float, default=0.0, help="with --report-only: the pass's CPU seconds")
    args = parser.parse_args()
    import torch

    import palaestra.egpo.plugins  # noqa: F401  (egpo's task source and rewards)
    from palaestra.shared.rl.config import TrainConfig
    from palaestra.shared.rl.pilot import PilotError, verdict
    from palaestra.shared.rl.trainer import Trainer

    data = read_yaml(args.config)
    matrix = data.pop("matrix", None) or {}
    planned = int((data.get("pilot") or {}).get("candidates", 0))  # the config's own, before any override
    cfg = load_config(data, [*args.overrides, "tracking.enabled=false"])
    assert isinstance(cfg, TrainConfig), f"{args.config}: not a training config ({type(cfg).__name__})"
    torch.set_num_threads(max(cfg.torch_threads, 1))
    path = Path(cfg.pilot.cache or Path(cfg.output_dir) / "pilot.jsonl")
    before = sum(len(c) for c in cached_chunks(path).values())
    wall, cpu = time.perf_counter(), time.process_time()
    if args.report_only:
        before = 0
    else:
        trainer = Trainer(cfg)
        try:
            trainer.prepare()
        except PilotError as e:
            print(f"pilot: {e}")
        finally:
            trainer.close()
    wall, cpu = time.perf_counter() - wall, args.cpu_s or time.process_time() - cpu
    chunks = cached_chunks(path)
    tasks = [t for c in sorted(chunks) for t in chunks[c]]
    verdicts = Counter(verdict(t["rewards"], cfg.pilot.tolerance) for t in tasks)
    n, mixed = len(tasks), verdicts["mixed"]
    lo, hi = wilson_interval(mixed, n)
    k = cfg.pilot.samples
    print(f"pilot {path}: {n} tasks x {k} samples: {dict(verdicts)}")
    print(f"mixed share {mixed}/{n} = {mixed / max(n, 1):.3f} [95% Wilson {lo:.3f}, {hi:.3f}]")
    rewards = [r for t in tasks for agent in t["rewards"].values() for r in agent]
    print(f"reward mean {sum(rewards) / max(len(rewards), 1):.3f} over {len(rewards)} samples")
    tokens = sum(t.get("tokens", 0) for t in tasks)
    print(f"response tokens {tokens}: {tokens / max(n * k, 1):.1f} per sample")
    played = n - before
    print(f"this process: {cpu:.0f} CPU-s, {wall:.0f} s wall, {played} tasks played (model load, env build included)")
    per_sample = cpu / max(played * k, 1)
    print(f"CPU-s per played task {cpu / max(played, 1):.1f}, per sample {per_sample:.2f} (an upper bound)")
    runs = math.prod(len(v) for v in (matrix.get("axes") or {"": [0]}).values())
    train = runs * cfg.steps * cfg.tasks_per_step * cfg.rollout.group_size
    evals = runs * sum((getattr(cfg.eval, "limits", None) or {}).values())  # egpo's BFCL entries
    pilot = (planned or n) * k
    total = pilot + train + evals
    update = runs * cfg.steps * args.update_cpu_s
    print(
        f"demonstration: {runs} runs; samples: pilot {pilot} + training {train} + evaluation {evals} = {total}"
        f" -> {total * per_sample / 60:.0f} CPU-min sampling + {update / 60:.0f} CPU-min updates"
        f" ({args.update_cpu_s:.0f} CPU-s per step) = {(total * per_sample + update) / 60:.0f} CPU-min"
    )


def cached_chunks(path: Path) -> dict[int, list]:
    """The chunks a pilot cache holds (the pass itself checked its fingerprint); none if there is no file."""
    import json

    lines = path.read_text().splitlines()[1:] if path.is_file() else []
    return {int(row["chunk"]): row["tasks"] for row in map(json.loads, lines)}


if __name__ == "__main__":
    main()
