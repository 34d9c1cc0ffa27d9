"""The Kuhn demonstration's table from MLflow: exploitability per evaluation step of kuhn_cpu.yaml runs (RL) and
kuhn_cpu_control.yaml runs (no RL), by seed, with the uniform policy and the warm start's SFT target for reference.

    python experiments/mars/kuhn_table.py [--tracking-uri sqlite:///mlruns/mlflow.db] [--experiment mars-kuhn]

Prints a markdown table (the one in packages/mars/docs/experiments.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=f"sqlite:///{Path('mlruns/mlflow.db').resolve()}")
    parser.add_argument("--experiment", default="mars-kuhn")
    args = parser.parse_args()
    import mlflow

    client = mlflow.tracking.MlflowClient(args.tracking_uri)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        raise SystemExit(f"no MLflow experiment {args.experiment!r} at {args.tracking_uri}")
    rows = {}
    for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"]):
        params = run.data.params
        kind = "control" if "kuhn_cpu_control" in params.get("output_dir", "") else "RL"
        history = client.get_metric_history(run.info.run_id, "eval/kuhn_poker/exploitability")
        if run.info.status == "FINISHED" and history:
            sft = params.get("sft_warmup.steps")
            rows[(kind, int(params["seed"]))] = (sft, sorted((m.step, m.value) for m in history))
    print("| run | seed | SFT steps | exploitability at RL step 0, 5, 10, ... | end | end - start |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (kind, seed), (sft, hist) in sorted(rows.items()):
        values = ", ".join(f"{v:.3f}" for _, v in hist)
        start, end = hist[0][1], hist[-1][1]
        delta = f"{end - start:+.3f}" if kind == "RL" else "-"
        print(f"| {kind} | {seed} | {sft} | {values} | {end:.3f} | {delta} |")
    print("| uniform policy | - | - | 0.458 (11/24) | | |")
    print("| SFT target (CFR half, uniform half) | - | - | 0.199 | | |")


if __name__ == "__main__":
    main()
