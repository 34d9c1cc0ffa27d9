"""`palaestra plan`'s evaluation-time estimate for mars.train (`palaestra.mars.eval_cost`), against closed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.mars import eval_cost
from palaestra.shared.cli import main
from palaestra.shared.jobs import load_config
from palaestra.shared.plan import EVAL_COSTS, evaluations

ROOT = Path(__file__).resolve().parents[3]


def small(**eval_overrides):
    """Tic-tac-toe against MCTS-100 in the first seat and mini Hanabi in self-play, 4 episodes, 64-token turns,
    generation in this process; 10 steps, evaluated before, at steps 4 and 8, and at the end."""
    e = {
        "games": ["tic_tac_toe", "mini_hanabi"],
        "opponents": ["mcts"],
        "mcts_simulations": 100,
        "seats": ["first"],
        "episodes": 4,
        **eval_overrides,
    }
    top = {"job": "mars.train", "llm": {"model": "tiny"}, "steps": 10, "eval_every": 4}
    return load_config({**top, "rollout": {"max_tokens_per_turn": 64}, "eval": e})  # eval's turn limit: 64


def test_serial_evaluation_is_the_closed_form():
    cfg = small()
    tokens = 0.5 * 64 / 50.0  # seconds per model turn: half the turn limit at 50 tokens/s (CPU assumption)
    ttt = 4 * 7.7 / 2 * tokens + 4 * 7.7 / 2 * 0.016  # the model's half of the moves, then MCTS-100 replies in turn
    hanabi = 4 * 5.5 * tokens  # every move is the model's
    cost = EVAL_COSTS.get("mars.train")(cfg, 2)
    assert cost.seconds == pytest.approx(ttt + hanabi)


def test_replies_on_ray_run_beside_generation_over_the_cpus(monkeypatch):
    cfg = small(mcts_on_ray=True, mcts_simulations=1000)
    tokens = 0.5 * 64 / 50.0
    model_ttt = 4 * 7.7 / 2 * tokens
    searches = 4 * 7.7 / 2 * 5.6 * 0.088 / 2  # a search per legal learner move, over 2 CPUs
    assert searches < model_ttt  # the setting waits for the generation
    cost = eval_cost.train_eval_cost(cfg, 2)
    assert cost.seconds == pytest.approx(model_ttt + 4 * 5.5 * tokens)
    monkeypatch.setattr(eval_cost, "CPU_TOKENS_PER_S", 1e4)  # fast generation: the searches set the pace
    fast = 0.5 * 64 / 1e4
    opp = max(4 * 7.7 / 2 * 5.6 * 0.088, 7.7 / 2 * 0.088)  # one CPU: every search in sequence
    assert opp > 4 * 7.7 / 2 * fast
    assert eval_cost.train_eval_cost(cfg, 1).seconds == pytest.approx(opp + 4 * 5.5 * fast)


def test_mcts_cost_scales_linearly_from_the_nearest_measured_count():
    assert eval_cost.mcts_seconds("connect_four", 1000) == 0.56  # the measured figures on the games' classes
    assert eval_cost.mcts_seconds("tic_tac_toe", 200) == pytest.approx(2 * 0.016)
    with pytest.raises(ValueError, match="no MCTS timing"):
        eval_cost.mcts_seconds("kuhn_poker", 100)
    with pytest.raises(ValueError, match="unknown game 'go'"):
        eval_cost.mcts_seconds("go", 100)


def test_evaluations_are_those_the_trainer_runs():
    """Before, at every multiple of eval_every short of the last step, and at the end (`Trainer.train`)."""
    for steps, every, before in [(10, 4, True), (200, 50, True), (8, 4, False), (5, 0, True), (1, 1, True)]:
        cfg = small()
        cfg.steps, cfg.eval_every, cfg.eval_before = steps, every, before
        runs = int(before) + sum(1 for s in range(1, steps) if every and s % every == 0) + 1
        assert evaluations(cfg) == runs


def test_plan_of_the_paper_config_prints_an_evaluation_time(capsys):
    assert main(["plan", str(ROOT / "experiments/mars/qwen3_4b.yaml")]) == 0
    out = capsys.readouterr().out
    assert "evaluation: 15 settings x 128 episodes" in out
    line = next(x for x in out.splitlines() if x.startswith("evaluation time:"))
    assert "x 5 evaluations" in line  # before, steps 50, 100, 150, the end
    assert "connect_four vs mcts1000" in out


def test_a_job_without_an_estimator_says_so(capsys):
    assert main(["plan", str(ROOT / "experiments/egpo/qwen3_4b_bfcl.yaml")]) in (0, 1)
    assert "evaluation time: not estimated" in capsys.readouterr().out
