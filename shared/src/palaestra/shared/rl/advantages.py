"""Advantage estimators, registered by name and composed as a pipeline from config.

Advantages live at turn granularity: one value per turn of each trajectory,
broadcast later to that turn's response tokens (a single-turn trajectory has
one). A pipeline is a list of steps; the first one makes values from rewards
(`grpo`, `turn_level`, `mars_code_norm`), the next ones transform them
(`agent_norm`, `entropy_clipped`)::

    advantages:                       # EGPO
      - {name: grpo}
      - {name: entropy_clipped, options: {lam: 0.4, alpha: 2.0}}
    advantages:                       # MARS
      - {name: turn_level, options: {gamma: 1.0}}
      - {name: agent_norm}

Formulas:

- ``grpo``: A_i = (r_i - mean(r_group)) / (std(r_group) + eps), r_i the
  trajectory's total reward; the group is (group id, agent) so self-play seats
  are compared with their own seat. ``scale``: group (default) | batch | none.
  A group whose rewards are all equal gets 0 (never NaN).
- ``entropy_clipped`` (EGPO): A + λ·clip(H, -|A|/α, |A|/α), H the mean token
  entropy of the chain of thought (``<think>`` span), detached. With λ < α the
  bonus is below |A| in size, so it never flips A's sign (H >= 0 anyway).
- ``turn_level`` (MARS): R_t = Σ_{t'>=t} γ^{t'-t} r_{t'} over the agent's turns.
- ``agent_norm`` (MARS): (x - mean_k) / (std_k + eps) over all turns of the batch
  that share (agent, env type) k.
- ``mars_code_norm`` (MARS's code path, thu-nics/MARS ``roll/utils/functionals.py``
  ``reward_postprocess_agentic`` + ``compute_advantage``); starts a pipeline, see
  its docstring for the five steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from palaestra.shared.config import ConfigError
from palaestra.shared.config_checks import check_kwargs, registry_kwargs, registry_name
from palaestra.shared.registry import Registry
from palaestra.shared.rollout.trajectory import Trajectory

Values = list[np.ndarray]  # one float array per trajectory, one entry per turn


@dataclass
class AdvantageInput:
    """What estimators see of a batch of trajectories."""

    turn_rewards: Values
    group_ids: list[str]
    agents: list[str]
    env_types: list[str]
    turn_tokens: Values
    """Response tokens per turn (for token-weighted statistics)."""
    think_entropy: np.ndarray | None = None
    """Per trajectory: mean token entropy over its ``<think>`` span (NaN: no span); set by the trainer when a
    step of the pipeline reads entropies (its estimator has ``uses_entropy = True``; see `reads_entropy`)."""
    response_entropy: np.ndarray | None = None
    """Per trajectory: mean token entropy over all its response tokens; set by the trainer."""
    stats: dict[str, float] = field(default_factory=dict)
    """What a step reports about its effect (logged per training step), e.g. ``entropy_clipped``'s."""

    @classmethod
    def from_trajectories(
        cls,
        trajs: Sequence[Trajectory],
        think_entropy: np.ndarray | None = None,
        response_entropy: np.ndarray | None = None,
    ):
        rewards = []
        for t in trajs:
            r = np.array([turn.reward for turn in t.turns], dtype=np.float64)
            if len(r):  # rewards that reached the agent before its first turn count on that turn
                r[0] += t.extra_reward
            rewards.append(r)
        return cls(
            turn_rewards=rewards,
            group_ids=[t.group_id for t in trajs],
            agents=[t.agent for t in trajs],
            env_types=[t.env_type for t in trajs],
            turn_tokens=[np.array([len(turn.response_ids) for turn in t.turns], dtype=np.float64) for t in trajs],
            think_entropy=think_entropy,
            response_entropy=response_entropy,
        )


Estimator = Callable[..., Values]
ADVANTAGES: Registry[Estimator] = Registry("advantage estimator", "palaestra.advantages")


@dataclass
class AdvantageStep:
    """One step of an advantage pipeline."""

    name: str = field(default="grpo", metadata=registry_name(ADVANTAGES))
    """Registered estimator (`ADVANTAGES`): grpo | entropy_clipped | turn_level | agent_norm | mars_code_norm."""
    options: dict[str, Any] = field(default_factory=dict, metadata=registry_kwargs("name"))
    """Keyword options of the estimator (e.g. ``{lam: 0.4, alpha: 2.0}``)."""


def compute_advantages(steps: Sequence[AdvantageStep], batch: AdvantageInput) -> Values:
    """Run the pipeline; the first step makes values from rewards, the others transform them.

    A config's pipeline is checked when it resolves (`check_chain`, the options by each estimator's
    signature); a pipeline built in code is checked here by the same function.
    """
    check_pipeline(steps)
    values: Values | None = None
    for step in steps:
        values = ADVANTAGES.get(step.name)(values, batch, **step.options)
    assert values is not None  # the pipeline is not empty
    return values


def reads_entropy(steps: Sequence[AdvantageStep]) -> bool:
    """Whether a step of the pipeline reads token entropies: its estimator says so with ``uses_entropy = True``
    (the trainer then scores the batch before the update; otherwise it may skip that forward)."""
    return any(getattr(ADVANTAGES.get(step.name), "uses_entropy", False) for step in steps)


def check_pipeline(steps: Sequence[AdvantageStep]) -> None:
    """Raise `ConfigError` on what a config's resolve refuses: the chain's order and each step's options."""
    if problem := check_chain(list(steps)):
        raise ConfigError(f"invalid value for 'advantages': {problem}")
    for i, step in enumerate(steps):
        check_kwargs(
            ADVANTAGES.get(step.name), step.options, f"advantage estimator '{step.name}'", f"advantages.{i}.options"
        )


def starts(step: AdvantageStep) -> bool | None:
    """Whether `step`'s estimator makes values from rewards (``starts_pipeline = True``) or transforms them
    (``False``); None when the estimator does not say (its place in the chain is then not checked)."""
    return getattr(ADVANTAGES.get(step.name), "starts_pipeline", None)


def check_chain(steps: list[AdvantageStep], owner: Any = None) -> str | None:
    """A value check of ``advantages``: the first step makes values from rewards, every later one transforms.

    Unknown names are left to the name's own check (its did-you-mean).
    """
    if not steps:
        return "the advantage pipeline is empty; e.g. advantages: [{name: grpo}]"
    if any(step.name not in ADVANTAGES for step in steps):
        return None
    if starts(steps[0]) is False:
        return f"'{steps[0].name}' transforms advantages and has nothing before it; put e.g. grpo first"
    for i, step in enumerate(steps[1:], 1):
        if starts(step):
            return f"'{step.name}' (advantages[{i}]) makes values from rewards, so it must come first"
    return None


def _safe_norm(x: np.ndarray, mean: float, std: float, eps: float) -> np.ndarray:
    # an all-equal group (std 0) gives 0, never NaN, whatever eps is
    if std + eps <= 0:
        return np.zeros_like(x, dtype=np.float64)
    return (x - mean) / (std + eps)


class GrpoScale(StrEnum):
    """What `grpo` divides the centred rewards by."""

    group = "group"
    batch = "batch"
    none = "none"


class EntropySpan(StrEnum):
    """The tokens whose mean entropy `entropy_clipped` reads."""

    think = "think"
    response = "response"


@ADVANTAGES.register("grpo")
def grpo(
    values: Values | None, batch: AdvantageInput, *, eps: float = 1e-6, scale: GrpoScale = GrpoScale.group
) -> Values:
    """Group-relative advantage of each trajectory's total reward, broadcast to all its turns."""
    returns = np.array([r.sum() for r in batch.turn_rewards])
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, key in enumerate(zip(batch.group_ids, batch.agents)):
        groups[key].append(i)
    adv = np.zeros_like(returns)
    for idx in groups.values():
        r = returns[idx]
        centred = r - r.mean()
        if scale == "group":
            adv[idx] = _safe_norm(r, r.mean(), r.std(ddof=1), eps) if len(r) > 1 else 0.0
        else:
            adv[idx] = centred
    if scale == "batch" and len(returns) > 1:
        adv = _safe_norm(adv, 0.0, returns.std(ddof=1), eps)
    return [np.full(len(r), a) for r, a in zip(batch.turn_rewards, adv)]


@ADVANTAGES.register("turn_level")
def turn_level(values: Values | None, batch: AdvantageInput, *, gamma: float = 1.0) -> Values:
    """Per-agent returns to go over turn rewards (MARS)."""
    out = []
    for r in batch.turn_rewards:
        ret = np.zeros_like(r)
        running = 0.0
        for t in range(len(r) - 1, -1, -1):
            running = r[t] + gamma * running
            ret[t] = running
        out.append(ret)
    return out


def _player_groups(batch: AdvantageInput) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, key in enumerate(zip(batch.agents, batch.env_types)):
        groups[key].append(i)
    return groups


@ADVANTAGES.register("agent_norm")
def agent_norm(values: Values | None, batch: AdvantageInput, *, eps: float = 1e-6, by_env: bool = True) -> Values:
    """Normalize over all turns of the batch per (agent, env type) (MARS's agent-specific normalization).

    The paper's clean form: (R - mean_k) / std_k over the returns to go of group k, each turn counting once.
    MARS's code (`mars_code_norm`) differs: it centres the rewards (not the returns) per group, whitens
    them and the advantages over all response tokens of the batch (long turns weigh more), and re-centres
    on the mean of the distinct values per agent across games; the two agree in sign mostly, not in value.
    """
    assert values is not None  # a transform (check_chain)
    groups = _player_groups(batch) if by_env else _group_by(batch.agents)
    out = [v.astype(np.float64).copy() for v in values]
    for idx in groups.values():
        pooled = np.concatenate([values[i] for i in idx])
        if len(pooled) < 2:
            for i in idx:
                out[i] = np.zeros_like(values[i], dtype=np.float64)
            continue
        mean, std = pooled.mean(), pooled.std(ddof=1)
        for i in idx:
            out[i] = _safe_norm(values[i], mean, std, eps)
    return out


def _group_by(keys: list[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    return groups


@ADVANTAGES.register("mars_code_norm")
def mars_code_norm(values: Values | None, batch: AdvantageInput, *, eps: float = 1e-8) -> Values:
    """MARS's code path, in its order (thu-nics/MARS, ``roll/utils/functionals.py``), from the turn rewards:

    1. centre the turn rewards per (env type, agent): minus the mean over that group's turns (each turn once,
       ``reward_normalization: {grouping: tags, method: mean, separate_norm_for_selfplay: true}``);
    2. whiten the token-level rewards over all response tokens of the batch (``whiten_rewards``,
       ``masked_whiten``: the turn's reward sits on its last token, the other tokens hold 0; unbiased
       token variance, eps 1e-8);
    3. returns to go over tokens, γ = 1 (``adv_estimator: reinforce``);
    4. per agent (all games together, ``advantage_norm: mean``): subtract the mean of the distinct values of
       that agent's advantage tensor, the 0 of the positions after the last turn included;
    5. whiten the advantages over all response tokens (token-weighted, unbiased, ``eps``: ``whiten_advantages``).

    Values within 1e-9 count as one in step 4 (MARS compares floats exactly, where rounding can split a
    value in two). Step 1 makes the rewards sum to 0, so step 2's token mean is 0, every token of a turn
    carries that turn's return to go, and one value per turn is exact. An agent whose values are all 0 keeps
    them (MARS returns zeros there). Step 2 uses MARS's fixed eps 1e-8; ``eps`` is step 5's.
    """
    rewards = [r.astype(np.float64) for r in batch.turn_rewards]
    if not rewards:
        return []
    tokens = np.concatenate(batch.turn_tokens)
    n_tokens = tokens.sum()
    if n_tokens < 2:
        return [np.zeros_like(r) for r in rewards]
    # 1. centre per (env type, agent), each turn counting once
    centred = [r.copy() for r in rewards]
    for idx in _player_groups(batch).values():
        mean = np.concatenate([rewards[i] for i in idx]).mean()
        for i in idx:
            centred[i] = rewards[i] - mean
    # 2. whiten token-level rewards: the turn's value on its last token, zeros on the other response tokens
    flat = np.concatenate(centred)
    mean = flat.sum() / n_tokens
    var = (((flat - mean) ** 2).sum() + (n_tokens - len(flat)) * mean**2) / (n_tokens - 1)
    whitened = [(c - mean) / np.sqrt(var + 1e-8) for c in centred]
    # 3. returns to go (γ 1; the tokens of a turn share its return since the token mean above is 0)
    returns = [np.cumsum(w[::-1])[::-1] for w in whitened]
    # 4. per agent, minus the mean of the distinct values (0 included: the positions after the last turn)
    shifted = [ret.copy() for ret in returns]
    for idx in _group_by(batch.agents).values():
        pooled = np.sort(np.concatenate([returns[i] for i in idx] + [np.zeros(1)]))
        distinct = pooled[np.concatenate([[True], np.diff(pooled) > 1e-9])]
        if len(distinct) > 1:
            for i in idx:
                shifted[i] = returns[i] - distinct.mean()
    # 5. token-weighted whitening over the batch
    flat = np.concatenate(shifted)
    mean = np.average(flat, weights=tokens)
    var = np.average((flat - mean) ** 2, weights=tokens) * n_tokens / (n_tokens - 1)
    return [(s - mean) / np.sqrt(var + eps) for s in shifted]


@ADVANTAGES.register("entropy_clipped")
def entropy_clipped(
    values: Values | None,
    batch: AdvantageInput,
    *,
    lam: float = 0.4,
    alpha: float = 2.0,
    span: EntropySpan = EntropySpan.think,
) -> Values:
    """EGPO: A + λ·clip(H, -|A|/α, |A|/α), H the (detached) mean entropy of the think span.

    ``span="response"`` takes H over the whole response instead (for tasks without a think block).
    """
    assert values is not None  # a transform (check_chain)
    entropy = batch.think_entropy if span == "think" else batch.response_entropy
    if entropy is None:
        raise ValueError("entropy_clipped needs token entropies (the trainer computes them)")
    out = []
    for v, h in zip(values, entropy):
        h = 0.0 if not np.isfinite(h) else float(h)  # no think span: no bonus
        bound = np.abs(v) / alpha
        out.append(v + lam * np.clip(h, -bound, bound))
    # what the term did: the share of advantages it changed, its size against theirs, and the groups whose
    # advantages were all 0 (equal rewards) that it made non-zero (never, with this clip: the bound is |A|/α)
    before, after = np.concatenate([*values, np.zeros(0)]), np.concatenate([*out, np.zeros(0)])
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(batch.group_ids, batch.agents)):
        groups[key].append(i)
    lifted = sum(
        all(not values[i].any() for i in members) and any(out[i].any() for i in members) for members in groups.values()
    )
    batch.stats.update(
        {
            "adv/entropy_changed_share": float((before != after).mean()) if len(before) else 0.0,
            "adv/entropy_bonus_ratio": float(np.abs(after - before).sum() / max(np.abs(before).sum(), 1e-12)),
            "adv/entropy_zero_groups": float(sum(all(not values[i].any() for i in m) for m in groups.values())),
            "adv/entropy_zero_to_nonzero_groups": float(lifted),
        }
    )
    return out


def _entropy_clipped_check(options: dict[str, Any]) -> str | None:
    lam, alpha = options["lam"], options["alpha"]
    if alpha <= 0 or lam < 0:
        return f"need alpha > 0 and lam >= 0, got lam={lam}, alpha={alpha}"
    if lam >= alpha:
        return f"lam ({lam}) >= alpha ({alpha}) could flip the advantage's sign"
    return None


entropy_clipped.uses_entropy = True  # type: ignore[attr-defined]
entropy_clipped.check_arguments = _entropy_clipped_check  # type: ignore[attr-defined]
for _maker in (grpo, turn_level, mars_code_norm):  # they make values from rewards: a pipeline's first step
    _maker.starts_pipeline = True  # type: ignore[attr-defined]
for _transform in (agent_norm, entropy_clipped):  # they transform the values of the steps before them
    _transform.starts_pipeline = False  # type: ignore[attr-defined]
