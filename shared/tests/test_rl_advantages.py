"""Advantage estimators against hand-computed closed forms."""

import math

import numpy as np
import pytest

from palaestra.shared.rl.advantages import AdvantageInput, AdvantageStep, check_pipeline, compute_advantages


def batch(rewards, groups=None, agents=None, envs=None, tokens=None, entropy=None):
    n = len(rewards)
    return AdvantageInput(
        turn_rewards=[np.array(r, dtype=float) for r in rewards],
        group_ids=groups or ["g"] * n,
        agents=agents or ["agent"] * n,
        env_types=envs or ["text"] * n,
        turn_tokens=[np.array(t, dtype=float) for t in (tokens or [[1] * len(r) for r in rewards])],
        think_entropy=None if entropy is None else np.array(entropy, dtype=float),
    )


def run(steps, b):
    return compute_advantages([AdvantageStep(n, o) for n, o in steps], b)


def test_grpo_closed_form():
    # group rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3)
    out = run([("grpo", {"eps": 0.0})], batch([[1], [0], [0], [1]]))
    s = math.sqrt(1 / 3)
    assert [float(a[0]) for a in out] == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])


def test_grpo_groups_are_separate_and_equal_groups_give_zero():
    b = batch([[1], [1], [0], [2]], groups=["a", "a", "b", "b"])
    out = run([("grpo", {})], b)
    assert out[0][0] == 0.0 and out[1][0] == 0.0  # equal rewards: 0, not NaN
    assert out[2][0] == pytest.approx(-1 / math.sqrt(2), rel=1e-5)
    assert out[3][0] == pytest.approx(1 / math.sqrt(2), rel=1e-5)


def test_grpo_single_member_group_is_zero():
    out = run([("grpo", {})], batch([[3.0]]))
    assert out[0][0] == 0.0


def test_grpo_scale_options():
    b = batch([[1], [0], [4], [2]], groups=["a", "a", "b", "b"])
    none = run([("grpo", {"scale": "none"})], b)
    assert [float(a[0]) for a in none] == [0.5, -0.5, 1.0, -1.0]
    batch_std = np.std([1, 0, 4, 2], ddof=1)
    scaled = run([("grpo", {"scale": "batch", "eps": 0.0})], b)
    expected = [0.5 / batch_std, -0.5 / batch_std, 1 / batch_std, -1 / batch_std]
    assert [float(a[0]) for a in scaled] == pytest.approx(expected)


def test_grpo_multi_turn_broadcasts_total_reward():
    out = run([("grpo", {"scale": "none"})], batch([[1, 1, 0], [0, 0]]))
    # totals 2 and 0 -> +1 and -1 on every turn
    assert out[0].tolist() == [1.0, 1.0, 1.0] and out[1].tolist() == [-1.0, -1.0]


def test_grpo_groups_by_seat_in_self_play():
    b = batch([[1], [-1], [0], [0]], groups=["g"] * 4, agents=["p0", "p1", "p0", "p1"])
    out = run([("grpo", {"scale": "none"})], b)
    assert [float(a[0]) for a in out] == [0.5, -0.5, -0.5, 0.5]


def test_turn_level_returns_to_go():
    out = run([("turn_level", {"gamma": 0.5})], batch([[1, 0, 2]]))
    # R2 = 2, R1 = 0 + .5*2 = 1, R0 = 1 + .5*1 = 1.5
    assert out[0].tolist() == [1.5, 1.0, 2.0]
    out = run([("turn_level", {})], batch([[0.05, 0.05, 1.0]]))
    assert out[0].tolist() == pytest.approx([1.1, 1.05, 1.0])


def test_agent_norm_per_agent_and_env():
    b = batch(
        [[1, 3], [5], [10], [10]],
        agents=["p0", "p0", "p1", "p1"],
        envs=["ttt", "ttt", "ttt", "ttt"],
    )
    out = run([("turn_level", {"gamma": 0.0}), ("agent_norm", {"eps": 0.0})], b)
    # p0 pooled turns: 1, 3, 5 -> mean 3, sample std 2
    assert out[0].tolist() == pytest.approx([-1.0, 0.0]) and out[1].tolist() == pytest.approx([1.0])
    assert out[2].tolist() == [0.0] and out[3].tolist() == [0.0]  # equal: 0, not NaN


def test_agent_norm_separates_env_types():
    b = batch([[1], [3], [100], [300]], envs=["a", "a", "b", "b"])
    out = run([("turn_level", {}), ("agent_norm", {"eps": 0.0})], b)
    s = math.sqrt(2)
    assert [float(v[0]) for v in out] == pytest.approx([-1 / s, 1 / s, -1 / s, 1 / s])


def test_entropy_clipped_closed_form():
    # A = +-1/sqrt(1/2)=+-sqrt(2)/... use scale none: A = +0.5, -0.5
    b = batch([[1], [0]], entropy=[0.1, 5.0])
    out = run([("grpo", {"scale": "none"}), ("entropy_clipped", {"lam": 0.4, "alpha": 2.0})], b)
    # +0.5 + 0.4*clip(0.1, -.25, .25) = 0.54 ; -0.5 + 0.4*clip(5, -.25, .25) = -0.4
    assert out[0][0] == pytest.approx(0.54) and out[1][0] == pytest.approx(-0.4)


def test_entropy_term_never_flips_sign_nor_exceeds_bound():
    rng = np.random.default_rng(0)
    rewards = [[float(r)] for r in rng.integers(0, 2, 64)]
    entropy = rng.exponential(3.0, 64)
    b = batch(rewards, groups=[str(i // 8) for i in range(64)], entropy=entropy)
    base = run([("grpo", {})], b)
    out = run([("grpo", {}), ("entropy_clipped", {"lam": 0.4, "alpha": 2.0})], b)
    for a, e in zip(base, out):
        bonus = e[0] - a[0]
        assert abs(bonus) <= 0.4 * abs(a[0]) / 2.0 + 1e-12
        assert np.sign(e[0]) == np.sign(a[0])  # zero stays zero


def test_entropy_clipped_without_think_span_adds_nothing():
    b = batch([[1], [0]], entropy=[float("nan"), 1.0])
    out = run([("grpo", {"scale": "none"}), ("entropy_clipped", {})], b)
    assert out[0][0] == 0.5 and out[1][0] == pytest.approx(-0.5 + 0.4 * 0.25)


def _mars_code_reference(rewards, agents, envs, tokens, env_gap=2, pad=3):
    """MARS's five steps on padded token tensors (one row per trajectory), written from its description:
    turn reward on the turn's last token, `env_gap` environment tokens between turns, `pad` padding tokens."""
    rows, masks, ends = [], [], []
    for r, n in zip(rewards, tokens):
        vals, mask, end = [], [], []
        for k, (rew, cnt) in enumerate(zip(r, n)):
            vals += [0.0] * (int(cnt) - 1) + [rew]
            mask += [1.0] * int(cnt)
            end += [0.0] * (int(cnt) - 1) + [1.0]
            if k < len(r) - 1:
                vals += [0.0] * env_gap
                mask += [0.0] * env_gap
                end += [0.0] * env_gap
        rows.append(vals), masks.append(mask), ends.append(end)
    length = max(len(v) for v in rows) + pad
    x = np.zeros((len(rows), length))
    m, e = np.zeros_like(x), np.zeros_like(x)
    for i in range(len(rows)):
        x[i, : len(rows[i])], m[i, : len(masks[i])], e[i, : len(ends[i])] = rows[i], masks[i], ends[i]
    # 1. per (game, player): minus the masked mean over turn ends
    for key in set(zip(envs, agents)):
        sel = [i for i in range(len(rows)) if (envs[i], agents[i]) == key]
        mu = (x[sel] * e[sel]).sum() / e[sel].sum()
        x[sel] = (x[sel] - mu) * e[sel]
    # 2. masked whiten over response tokens (unbiased, eps 1e-8), then times the mask
    mu = (x * m).sum() / m.sum()
    var = (((x - mu) ** 2) * m).sum() / m.sum() * m.sum() / (m.sum() - 1)
    x = (x - mu) / np.sqrt(var + 1e-8) * m
    # 3. returns to go over all positions, gamma 1
    ret = np.flip(np.cumsum(np.flip(x, 1), 1), 1)
    # 4. per player: minus the mean of the distinct values of the player's whole tensor (rounding noise merged)
    for player in set(agents):
        sel = [i for i in range(len(rows)) if agents[i] == player]
        ret[sel] = ret[sel] - np.unique(np.round(ret[sel], 9)).mean()
    # 5. masked whiten of the advantages
    mu = (ret * m).sum() / m.sum()
    var = (((ret - mu) ** 2) * m).sum() / (m.sum() - 1)
    return (ret - mu) / np.sqrt(var + 1e-8), m


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mars_code_norm_matches_token_level_reference(seed):
    rng = np.random.default_rng(seed)
    n = 12
    rewards = [rng.choice([-1.0, 0.05, 0.1, 1.0, -11.0], size=rng.integers(1, 5)) for _ in range(n)]
    tokens = [rng.integers(1, 9, size=len(r)).astype(float) for r in rewards]
    agents = [f"player_{i % 2}" for i in range(n)]
    envs = ["tic_tac_toe" if i < 8 else "kuhn_poker" for i in range(n)]
    b = batch([r.tolist() for r in rewards], agents=agents, envs=envs, tokens=[t.tolist() for t in tokens])
    out = run([("mars_code_norm", {})], b)
    adv, mask = _mars_code_reference(rewards, agents, envs, tokens)
    for i in range(n):
        mine = np.repeat(out[i], tokens[i].astype(int))  # every token of a turn carries the turn's value
        assert mine == pytest.approx(adv[i][mask[i] > 0], abs=1e-6)
    weights = np.concatenate(tokens)
    assert np.average(np.concatenate(out), weights=weights) == pytest.approx(0.0, abs=1e-9)


def test_mars_code_norm_starts_a_pipeline():
    with pytest.raises(ValueError, match="makes values from rewards, so it must come first"):
        run([("turn_level", {}), ("mars_code_norm", {})], batch([[1.0], [0.0]]))


def test_pipeline_errors_are_clear():
    with pytest.raises(ValueError, match="transforms advantages and has nothing before it; put e.g. grpo first"):
        run([("agent_norm", {})], batch([[1]]))
    with pytest.raises(ValueError, match="takes no argument 'lamda'; did you mean 'lam'"):
        check_pipeline([AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"lamda": 0.4})])
    with pytest.raises(KeyError, match="did you mean 'grpo'"):
        check_pipeline([AdvantageStep("grpoo")])
    with pytest.raises(ValueError, match="flip"):
        run([("grpo", {}), ("entropy_clipped", {"lam": 3.0, "alpha": 2.0})], batch([[1], [0]], entropy=[1, 1]))
