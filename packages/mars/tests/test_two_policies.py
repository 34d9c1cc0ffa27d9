"""Two policies, one per seat (rl/policies.py), in mars: the joint profile's read-off takes each player's
information states from its own policy; kuhn_two_policies.yaml's arms differ from kuhn_cpu.yaml's only where
they should; a tiny one-step run trains, logs under policy/<name>/ and saves each policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from palaestra.mars.model_policy import read_policy
from palaestra.shared.config import flatten
from palaestra.shared.jobs import run_job
from palaestra.shared.matrix import file_combinations

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments" / "mars"


def test_joint_read_off_takes_each_players_states_from_its_own_scorer():
    """Kuhn's information state string is the card then the betting so far: player 0 acts after 0 or 2
    actions (key length 1 or 3), player 1 after 1 (length 2). Scorer 0 prefers the first legal action by
    e^2, scorer 1 the second by e^1: the read-off must show each player's own preference."""
    first = lambda conversation, responses: [0.0] + [-2.0] * (len(responses) - 1)  # noqa: E731
    second = lambda conversation, responses: [-1.0] + [0.0] * (len(responses) - 1)  # noqa: E731
    _, table = read_policy([first, second], "kuhn_poker", "minimal")
    assert len(table) == 12
    for key, row in table.items():
        probs = np.array(row)
        player = 0 if len(key) in (1, 3) else 1
        expected = [1 / (1 + np.exp(-2.0)), np.exp(-2.0) / (1 + np.exp(-2.0))]
        if player == 1:
            expected = [np.exp(-1.0) / (1 + np.exp(-1.0)), 1 / (1 + np.exp(-1.0))]
        assert probs == pytest.approx(expected), key


def test_kuhn_two_policies_arms_are_kuhn_cpus_with_a_policy_per_seat():
    base = {
        (c.values["seed"], c.values["arm"]): flatten(c.cfg) for c in file_combinations(EXPERIMENTS / "kuhn_cpu.yaml")
    }
    ours = {
        (c.values["seed"], c.values["arm"]): c.cfg for c in file_combinations(EXPERIMENTS / "kuhn_two_policies.yaml")
    }
    assert set(ours) == {(s, a) for s in (0, 1, 2) for a in ("two", "shared", "control")}
    for s in (0, 1, 2):
        for arm, theirs in (("two", "rl"), ("shared", "rl"), ("control", "control")):
            cfg = flatten(ours[s, arm])
            differ = {k for k in set(cfg) | set(base[s, theirs]) if cfg.get(k) != base[s, theirs].get(k)}
            policies = {k for k in differ if k.split(".")[0] == "policies"}
            assert differ - policies == {"output_dir", "tracking.experiment"}, (s, arm)
            assert bool(policies) == (arm == "two")
        two = ours[s, "two"].policies
        assert {name: list(p.agents) for name, p in two.items()} == {"first": ["player_0"], "second": ["player_1"]}
        assert all(p.llm is p.optim is p.lora is p.learner is None for p in two.values())  # the run's own settings


def test_one_step_of_two_policies_runs(tracking, tmp_path):
    import mlflow

    overrides = [
        f"output_dir={tmp_path}",
        "sft_warmup.steps=2",
        "sft_warmup.source_kwargs.episodes=4",
        "sft_warmup.cache_dir=",
        "steps=1",
        "tasks_per_step=4",
        "eval_before=false",
        f"tracking.uri={tracking.uri}",
        f"tracking.artifact_root={tracking.artifact_root}",
        "tracking.experiment=test",
    ]
    (combo,) = file_combinations(EXPERIMENTS / "kuhn_two_policies.yaml", ["seed=0", "arm=two"], overrides)
    cfg = combo.cfg
    tmp_path = Path(cfg.output_dir)
    out = run_job(cfg)
    metrics = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"]).data.metrics
    # the untrained model loses on format at player_0's first move, so player_1 may never act: `first` trains
    assert np.isfinite(metrics["policy/first/train/loss"])
    for name in ("first", "second"):
        assert (tmp_path / "checkpoints" / "step_000001" / name / "optimizer.pt").is_file()
    assert "eval/kuhn_poker/exploitability" in metrics
