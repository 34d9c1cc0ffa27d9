"""mars.train self-play one step ahead of the learner (``rollout.max_staleness`` 1, shared rl/async_rollouts.py):
multi-turn games whose episodes may span an update."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from palaestra.shared.jobs import load_config, run_job

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "mars"


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["newest", "fixed"])
def test_mars_selfplay_one_step_ahead(tracking, tmp_path, schedule):
    cfg = load_config(
        EXPERIMENTS / "tiny_cpu.yaml",
        [
            f"output_dir={tmp_path}",
            "sft_warmup.steps=0",
            "steps=2",
            "tasks_per_step=2",
            "rollout.max_staleness=1",
            f"rollout.version_schedule={schedule}",
            "loss.behaviour_correction=tis",
            "eval.episodes=2",
            "eval_before=false",
            f"tracking.uri={tracking.uri}",
            f"tracking.artifact_root={tracking.artifact_root}",
            "tracking.experiment=test",
        ],
    )
    out = run_job(cfg)
    assert out["steps"] == 2
    client = mlflow.tracking.MlflowClient(tracking.uri)
    lag0 = client.get_metric_history(out["run_id"], "async/tokens_lag_0")
    lag1 = client.get_metric_history(out["run_id"], "async/tokens_lag_1")
    assert [m.step for m in lag1] == [1, 2] and lag1[0].value == 0 and lag1[1].value > 0
    if schedule == "fixed":  # the games of step 1 were played by version 0 throughout
        assert lag0[1].value == 0
    assert "eval/tic_tac_toe/first/random/win_rate" in client.get_run(out["run_id"]).data.metrics
