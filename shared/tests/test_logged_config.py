"""What ran is what is logged: the ``config.yaml`` a run logs to MLflow holds every derived setting, and running it
again reproduces the run's metrics (2-step tiny runs)."""

from __future__ import annotations

import mlflow
import pytest
import yaml

import palaestra.shared.rl.train  # noqa: F401  (registers rl.train)
from palaestra.shared.config import to_yaml
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.rewards import REWARDS

if "test_logged_length" not in REWARDS.names():  # a dense reward: every group has a signal
    REWARDS.register("test_logged_length")(lambda sample, completion, **info: len(completion) / 10)


def logged(out: dict, tracking, tmp_path) -> tuple[str, dict[str, list[float]]]:
    """The run's logged config.yaml and its train/ metrics per step (perf/ timings left out)."""
    client = mlflow.MlflowClient(tracking.uri)
    path = client.download_artifacts(out["run_id"], "config.yaml", str(tmp_path))
    run = client.get_run(out["run_id"])
    history = {
        k: [m.value for m in sorted(client.get_metric_history(out["run_id"], k), key=lambda m: m.step)]
        for k in run.data.metrics
        if k.startswith("train/")
    }
    return open(path).read(), history


def test_rerunning_the_logged_config_reproduces_the_run(tmp_path, tracking):
    cfg = load_config(
        {
            "job": "rl.train",
            "output_dir": str(tmp_path / "first"),
            "tracking": vars(tracking),
            "rollout": {"group_size": 2, "max_tokens_per_turn": 4},
            "loss": {"kl_coef": 0.05, "reduction": "dr_grpo"},  # max_len 0: derived from the rollout's 4 tokens
            "envs": [{"name": "task", "kwargs": {"reward": "test_logged_length"}}],
            "optim": {"lr": 1e-3},
            "steps": 2,
            "tasks_per_step": 2,
            "ppo_epochs": 2,
            "minibatch_size": 2,
        }
    )
    before = to_yaml(cfg)
    first = run_job(cfg)
    assert to_yaml(cfg) == before  # the job did not change its config after logging it
    text, metrics = logged(first, tracking, tmp_path / "a")
    assert yaml.safe_load(text)["loss"]["max_len"] == 4  # the derived normalizer is in the log
    again = load_config(yaml.safe_load(text), [f"output_dir={tmp_path / 'second'}"])
    second = run_job(again)
    text2, metrics2 = logged(second, tracking, tmp_path / "b")
    assert len(metrics["train/loss"]) == 2 and metrics["train/lr"] == [1e-3, 1e-3]
    assert metrics == metrics2
    assert text2 == text.replace(str(tmp_path / "first"), str(tmp_path / "second"))


@pytest.mark.parametrize("reduction", ["grpo", "dr_grpo"])
def test_the_resolved_config_is_a_fixed_point(reduction):
    """Loading the logged YAML resolves to the same YAML: nothing is derived twice or differently."""
    cfg = load_config({"job": "rl.train", "loss": {"reduction": reduction}, "rollout": {"max_tokens_per_turn": 7}})
    text = to_yaml(cfg)
    assert to_yaml(load_config(yaml.safe_load(text))) == text
    assert cfg.loss.max_len == (7 if reduction == "dr_grpo" else 0)
