"""The Kuhn demonstration's tables from MLflow: exploitability per evaluation step of kuhn_cpu.yaml runs (RL) and
its control arm (no RL), by seed, and each run's policy read off the model (P(<BET>) at the 12
information states) at its first and last evaluation, from the runs' per-evaluation JSON artifacts.

    python packages/mars/scripts/kuhn_table.py [--tracking-uri sqlite:///mlruns/mlflow.db] [--experiment mars-kuhn] \
        [--output-dir-contains _r5/]

Prints markdown tables (the ones in packages/mars/docs/experiments/). The RL train reward is the mean reward per
seat trajectory of the first and last RL step (legal games: about +0.05 per turn; a format loss costs its seat
the bet + 1). Only finished runs whose output_dir
contains the given text count (revisions 2-4 ran under outputs/mars/kuhn_cpu_r2/ to _r4/; revision 5 under
outputs/mars/kuhn_cpu_r5/ and outputs/mars/kuhn_cpu_control_r5/; the matrix writes outputs/mars/kuhn_cpu/seed-S_arm-rl
and ..._arm-control).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

STATES = ["0", "1", "2", "0p", "1p", "2p", "0b", "1b", "2b", "0pb", "1pb", "2pb"]
"""OpenSpiel's Kuhn information states: the card (0 J, 1 Q, 2 K), then the betting (p pass, b bet)."""


def _policy(client, run_id: str, step: int) -> dict[str, float] | None:
    """P(<BET>) by information state from the run's eval_results JSON of `step` (None when absent)."""
    try:
        path = client.download_artifacts(run_id, f"eval_results_step{step:05d}.json")
    except Exception:
        return None
    for record in json.loads(Path(path).read_text()):
        if "policy" in record:
            return {k: v[1] for k, v in record["policy"].items()}
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", default=f"sqlite:///{Path('mlruns/mlflow.db').resolve()}")
    parser.add_argument("--experiment", default="mars-kuhn")
    parser.add_argument("--output-dir-contains", default="_r5/")
    parser.add_argument(
        "--label-by-dir",
        action="store_true",
        help="name each run by its output_dir's last part less _sN (kuhn_ablation.yaml's arms) instead of RL/control",
    )
    args = parser.parse_args()
    import mlflow

    client = mlflow.tracking.MlflowClient(args.tracking_uri)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        raise SystemExit(f"no MLflow experiment {args.experiment!r} at {args.tracking_uri}")
    rows = {}
    for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"]):
        params = run.data.params
        if args.output_dir_contains not in params.get("output_dir", ""):
            continue
        out_dir = params.get("output_dir", "")
        kind = "control" if "kuhn_cpu_control" in out_dir or out_dir.endswith("arm-control") else "RL"
        if args.label_by_dir:
            kind = re.sub(r"(_s\d+$)|(^seed-\d+_arm-)", "", Path(out_dir).name)
        history = client.get_metric_history(run.info.run_id, "eval/kuhn_poker/exploitability")
        if run.info.status == "FINISHED" and history:
            hist = sorted((m.step, m.value) for m in history)
            minutes = (run.info.end_time - run.info.start_time) / 60000
            first, last = _policy(client, run.info.run_id, hist[0][0]), _policy(client, run.info.run_id, hist[-1][0])
            reward = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/reward_mean"))
            rewards = f"{reward[0][1]:+.2f} -> {reward[-1][1]:+.2f}" if reward else "-"
            rows[(kind, int(params["seed"]))] = (params.get("sft_warmup.steps"), hist, minutes, first, last, rewards)
    print("| run | seed | SFT steps | exploitability at each evaluation | end | end - start | RL reward | min |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (kind, seed), (sft, hist, minutes, _, _, rewards) in sorted(rows.items()):
        values = ", ".join(f"{v:.3f}" for _, v in hist)
        start, end = hist[0][1], hist[-1][1]
        delta = f"{end - start:+.3f}" if kind != "control" else "-"
        print(f"| {kind} | {seed} | {sft} | {values} | {end:.3f} | {delta} | {rewards} | {minutes:.1f} |")
    print()
    print("P(<BET>) read off the model at each information state (card J/Q/K = 0/1/2; p pass, b bet so far):")
    print()
    print("| run | seed | when | " + " | ".join(STATES) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in STATES) + " |")
    for (kind, seed), (_, hist, _, first, last, _) in sorted(rows.items()):
        evals = (("first eval", first), ("last eval", last)) if len(hist) > 1 else (("the evaluation", first),)
        for when, table in evals:
            if table is not None:
                cells = " | ".join(f"{table.get(s, float('nan')):.2f}" for s in STATES)
                print(f"| {kind} | {seed} | {when} (step {hist[0 if when == 'first eval' else -1][0]}) | {cells} |")


if __name__ == "__main__":
    main()
