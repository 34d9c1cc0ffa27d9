"""entropy_demo_rl.yaml's tables from MLflow: what EGPO's entropy term did at each training step (share of the
advantages it changed, its size against theirs, equal-reward groups and those it lifted) and the train reward,
by seed and arm; then each run's final BFCL accuracies.

    python packages/egpo/scripts/entropy_table.py [--tracking-uri sqlite:///mlruns/mlflow.db] \
        [--experiment egpo-entropy-demo] [--output-dir-contains entropy_demo/rl/]

Prints markdown tables (the ones in packages/egpo/docs/experiments/). The GRPO arm has no entropy term, so its
entropy columns are empty. Only finished runs whose output_dir contains the given text count.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

STEP_KEYS = {
    "changed share": "adv/entropy_changed_share",
    "bonus / |A|": "adv/entropy_bonus_ratio",
    "equal-reward groups": "adv/entropy_zero_groups",
    "lifted": "adv/entropy_zero_to_nonzero_groups",
    "train reward": "train/reward_mean",
}
EVAL_KEYS = ("simple_python", "multiple", "parallel")


def _cell(value: float | None, integer: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if integer else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=f"sqlite:///{Path('mlruns/mlflow.db').resolve()}")
    parser.add_argument("--experiment", default="egpo-entropy-demo")
    parser.add_argument("--output-dir-contains", default="entropy_demo/rl/")
    args = parser.parse_args()
    import mlflow

    client = mlflow.tracking.MlflowClient(args.tracking_uri)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        raise SystemExit(f"no MLflow experiment {args.experiment!r} at {args.tracking_uri}")
    runs = []
    for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"]):
        out = run.data.params.get("output_dir", "")
        if args.output_dir_contains not in out or run.info.status != "FINISHED":
            continue
        match = re.search(r"seed-(\d+)_arm-(\w+)", out)
        if match:
            runs.append((int(match[1]), match[2], run))
    runs.sort(key=lambda r: (r[0], r[1]))
    if not runs:
        raise SystemExit(f"no finished run with {args.output_dir_contains!r} in its output_dir")

    print("| seed | arm | step | " + " | ".join(STEP_KEYS) + " |")
    print("| --- " * (3 + len(STEP_KEYS)) + "|")
    for seed, arm, run in runs:
        history = {
            name: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for name, key in STEP_KEYS.items()
        }
        for step in sorted(history["train reward"]):
            cells = [_cell(history[n].get(step), integer=n in ("equal-reward groups", "lifted")) for n in STEP_KEYS]
            print(f"| {seed} | {arm} | {step} | " + " | ".join(cells) + " |")

    print()
    print("| seed | arm | " + " | ".join(EVAL_KEYS) + " |")
    print("| --- " * (2 + len(EVAL_KEYS)) + "|")
    for seed, arm, run in runs:
        cells = [_cell(run.data.metrics.get(f"bfcl/{c}/accuracy")) for c in EVAL_KEYS]
        print(f"| {seed} | {arm} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
