"""RAE (`palaestra.mars.rae`) against a re-implementation written here from SPIRAL's description.

SPIRAL (arXiv 2506.24119, section "Role-conditioned advantage estimation"): each role keeps a moving average
b of its returns, b <- α b + (1 - α) R, starting at 0; the advantage is R - b with b read before the update;
α 0.95. Here the roles are (game, seat).
"""

from __future__ import annotations

import numpy as np
import pytest

from palaestra.mars import plugins  # noqa: F401  (registers `rae`)
from palaestra.mars.rae import BASELINES, RoleBaselines
from palaestra.shared.jobs import load_config
from palaestra.shared.rl.advantages import AdvantageInput, AdvantageStep, check_pipeline, compute_advantages


def _spiral(steps: list[list[tuple[str, str, float]]], decay: float) -> list[list[float]]:
    """Per step, per trajectory (game, seat, return): R - b, from the paper's text."""
    b: dict[tuple[str, str], float] = {}
    out = []
    for step in steps:
        row = []
        for game, seat, ret in step:
            before = b.get((game, seat), 0.0)
            row.append(ret - before)
            b[(game, seat)] = decay * before + (1 - decay) * ret
        out.append(row)
    return out


def _batch(step: list[tuple[str, str, float]], rng: np.random.Generator) -> AdvantageInput:
    rewards = []
    for _, _, ret in step:  # the return split over 1-3 turns: RAE reads only the sum
        parts = rng.dirichlet(np.ones(rng.integers(1, 4)))
        rewards.append(parts * ret)
    return AdvantageInput(
        turn_rewards=rewards,
        group_ids=[str(i) for i in range(len(step))],
        agents=[seat for _, seat, _ in step],
        env_types=[game for game, _, _ in step],
        turn_tokens=[np.ones(len(r)) for r in rewards],
    )


def _steps(seed: int, n: int = 4) -> list[list[tuple[str, str, float]]]:
    rng = np.random.default_rng(seed)
    games, seats = ["kuhn_poker", "tic_tac_toe"], ["player_0", "player_1"]
    return [
        [(str(rng.choice(games)), str(rng.choice(seats)), float(rng.normal(0.3, 1.0))) for _ in range(12)]
        for _ in range(n)
    ]


def _run(steps, decay, rng) -> list[list[float]]:
    pipeline = [AdvantageStep("rae", {"decay": decay})]
    out = []
    for step in steps:
        values = compute_advantages(pipeline, _batch(step, rng))
        for v in values:  # one value per trajectory, on all of its turns
            assert np.all(v == v[0])
        out.append([float(v[0]) for v in values])
    return out


@pytest.mark.parametrize("decay", [0.95, 0.5])
def test_rae_equals_spirals_moving_average_across_steps(decay):
    BASELINES.reset()
    steps = _steps(0)
    got = _run(steps, decay, np.random.default_rng(1))
    np.testing.assert_allclose(got, _spiral(steps, decay), rtol=0, atol=1e-12)
    # negative control: one baseline shared by all roles gives other values
    shared = _spiral([[("g", "s", r) for _, _, r in step] for step in steps], decay)
    assert not np.allclose(got, shared)


def test_rae_state_resumes_where_it_stopped():
    steps, decay = _steps(3, n=6), 0.9
    BASELINES.reset()
    straight = _run(steps, decay, np.random.default_rng(2))
    BASELINES.reset()
    first = _run(steps[:3], decay, np.random.default_rng(2))
    saved = BASELINES.state_dict()
    BASELINES.reset()  # a new process
    fresh = _run(steps[3:], decay, np.random.default_rng(2))
    BASELINES.load_state_dict(saved)
    resumed = _run(steps[3:], decay, np.random.default_rng(2))
    np.testing.assert_allclose(first + resumed, straight, atol=1e-12)
    assert not np.allclose(fresh, straight[3:])  # without the state the baselines restart at 0


def test_rae_refuses_bad_decay_and_a_place_after_another_step():
    batch = _batch([("kuhn_poker", "player_0", 1.0)], np.random.default_rng(0))
    with pytest.raises(ValueError, match="decay must lie in"):
        compute_advantages([AdvantageStep("rae", {"decay": 1.0})], batch)
    with pytest.raises(ValueError, match="starts a pipeline"):
        compute_advantages([AdvantageStep("turn_level"), AdvantageStep("rae")], batch)
    with pytest.raises(ValueError, match="takes no argument 'gamma'"):
        check_pipeline([AdvantageStep("rae", {"gamma": 0.9})])


def test_rae_is_a_mars_train_estimator():
    cfg = load_config({"job": "mars.train", "advantages": [{"name": "rae", "options": {"decay": 0.95}}]})
    assert [a.name for a in cfg.advantages] == ["rae"]
    keys = RoleBaselines()
    assert keys.advantage("g/p", 2.0, 0.95) == 2.0 and keys.advantage("g/p", 2.0, 0.95) == pytest.approx(1.9)


def test_rae_baselines_follow_the_trainers_checkpoints(tmp_path):
    """The baselines written after each step's batch; a run resumed at checkpoint step S restores those after
    step S - 1 and continues exactly as the run that never stopped (the trainer's step as the clock)."""
    steps, decay = _steps(5, n=6), 0.9
    BASELINES.reset()
    straight = _run(steps, decay, np.random.default_rng(4))
    clock = {"step": 0}
    BASELINES.reset()
    BASELINES.attach(tmp_path / "rae_baselines.json", lambda: clock["step"])
    BASELINES.forget()
    for step in steps[:4]:  # the run stops after 4 steps, its checkpoint at step 4
        _run([step], decay, np.random.default_rng(4))
        clock["step"] += 1
    BASELINES.reset()
    BASELINES.attach(tmp_path / "rae_baselines.json", lambda: clock["step"])
    BASELINES.restore(2)  # an older checkpoint: step 2's baselines, not the last ones written
    assert BASELINES.state_dict() == pytest.approx(_state_after(steps[:2], decay))
    BASELINES.restore(4)
    resumed = _run(steps[4:], decay, np.random.default_rng(4))
    BASELINES.reset()
    np.testing.assert_allclose(resumed, straight[4:], atol=1e-12)
    with pytest.raises(ValueError, match="no baselines for step 9"):
        BASELINES.attach(tmp_path / "rae_baselines.json", lambda: 0)
        BASELINES.restore(10)
    BASELINES.reset()


def _state_after(steps, decay) -> dict[str, float]:
    b: dict[str, float] = {}
    for step in steps:
        for game, seat, ret in step:
            key = f"{game}/{seat}"
            b[key] = decay * b.get(key, 0.0) + (1 - decay) * ret
    return b


@pytest.mark.slow
def test_a_resumed_mars_train_run_continues_rae_exactly(tracking, tmp_path):
    """mars.train with rae on tiny Kuhn: 3 steps straight, against 2 steps then a resume for the third. The
    trainer resumes exactly, so the baselines after every step must match (they depend on every reward)."""
    import json

    from palaestra.shared.jobs import run_job

    def run(out, steps, resume):
        cfg = load_config(
            {
                "job": "mars.train",
                "llm": {"model": "tiny", "device": "cpu"},
                "output_dir": str(out),
                "games": [{"game": "kuhn_poker"}],
                "prompt": "minimal",
                "shaping": {"require_think": False},
                "rollout": {"max_tokens_per_turn": 6, "max_context_tokens": 512},
                "advantages": [{"name": "rae", "options": {"decay": 0.9}}],
                "steps": steps,
                "tasks_per_step": 4,
                "checkpoint_every": 1,
                "keep_checkpoints": 3,
                "resume": resume,
                "eval_before": False,
                "eval": {"games": ["kuhn_poker"], "opponents": ["random"], "episodes": 1, "max_tokens_per_turn": 6},
                "tracking": vars(tracking),
            }
        )
        run_job(cfg)
        return json.loads((out / "checkpoints" / "rae_baselines.json").read_text())

    straight = run(tmp_path / "a", 3, False)
    run(tmp_path / "b", 2, False)
    resumed = run(tmp_path / "b", 3, True)
    assert set(straight) == {"0", "1", "2"} and straight["2"] != straight["1"]
    for step in ("0", "1", "2"):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-9)
