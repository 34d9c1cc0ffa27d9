"""egpo.train one step ahead of the learner (``rollout.max_staleness`` 1, shared rl/async_rollouts.py)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from palaestra.shared.jobs import load_config, run_job

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "egpo"


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["newest", "fixed"])
def test_egpo_train_one_step_ahead(tmp_path, tracking, schedule):
    cfg = load_config(
        EXPERIMENTS / "tiny_cpu.yaml",
        [
            f"output_dir={tmp_path}",
            "sft_warmup.steps=0",
            "steps=2",
            "tasks_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens_per_turn=12",
            "rollout.max_staleness=1",
            f"rollout.version_schedule={schedule}",
            "loss.behaviour_correction=tis",
            "eval.categories=[]",
            "contamination_check=false",
        ],
    )
    cfg.tracking = tracking
    out = run_job(cfg)
    assert out["steps"] == 2
    client = mlflow.MlflowClient(tracking.uri)
    lag1 = client.get_metric_history(out["run_id"], "async/tokens_lag_1")
    assert [m.step for m in lag1] == [1, 2]  # logged after each update
    assert lag1[0].value == 0 and lag1[1].value > 0  # step 1 started before step 0's update: one step stale
    if schedule == "fixed":  # every token of step 1 sampled by version 0
        lag0 = client.get_metric_history(out["run_id"], "async/tokens_lag_0")
        assert lag0[1].value == 0
    assert "adv/entropy_changed_share" in client.get_run(out["run_id"]).data.metrics  # EGPO's term ran
