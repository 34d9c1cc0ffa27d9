"""MARS's batch composition (ROLL's agentic rollout scheduler), an option of `mars.train` (``batch.rule``).

The default (``mixture``) plays ``tasks_per_step`` episodes, each game drawn by its weight. MARS forms its
batch otherwise (thu-nics/MARS ``roll/agentic/rollout/rollout_scheduler.py`` ``get_batch``,
``env_manager.py`` ``run_rollout_loop``, ``agentic_config.py``): ``env_groups`` environments (MARS: 32 per
training game, 96 in all) each play episodes back to back, at most ``max_traj_per_env`` = ceil(rows /
environments) of them (MARS: ceil(384 / 96) = 4); every finished episode sends one row per seat that acted
(seat 0's then seat 1's), and the batch is the first ``rollout_batch_size`` rows to arrive (MARS: 384). Fast
games (Kuhn poker) fill more of the batch than their share of environments.

``first_finished`` is that rule, `FirstFinished`: a batch rule of the shared trainer (registered in
`BATCH_RULES` by `palaestra.mars.plugins`; ``mars.train`` builds ``Trainer(..., batch_rule=cfg.batch.rule)``). It
draws every slot's episodes, the rollout engine plays them in full (up to twice the rows kept), then it keeps
the rows in the order they would have arrived, each environment
timed by a clock: ``tokens`` (the episode's generated tokens: one environment waits for one response at a
time, and a response's time grows with its length) or ``turns`` (model calls). Ties go to the lower slot.

The batch also decides what a seat is credited with before its first turn (``batch.pre_turn_rewards``). The
env returns every reward OpenSpiel gives; the rollout engine keeps one that reaches a seat before it has acted
in ``Trajectory.extra_reward``, and the advantage input adds it to the seat's first turn (``report``). MARS's
env manager records a seat's rewards only from its first turn on (``env_manager.py`` ``_log_env_state``), so
it drops them: ``drop``, the paper config's choice. `MarsRows` is the batch rule that does both: it keeps the
rows of ``mixture`` or ``first_finished``, then credits them (registered as ``mars_rows``).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from palaestra.shared.config import ConfigError
from palaestra.shared.rl.batch_rules import AllRows
from palaestra.shared.rl.config import EnvSpec
from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutResult
from palaestra.shared.rollout.trajectory import Trajectory


class MarsBatchRule(StrEnum):
    mixture = "mixture"
    first_finished = "first_finished"


class Clock(StrEnum):
    tokens = "tokens"
    turns = "turns"


class PreTurnRewards(StrEnum):
    """Rewards that reach a seat before its first turn (mini Hanabi: seat 0's first card scores for both).

    report: credited to the seat's first turn (`AdvantageInput.from_trajectories`); drop: the seat gets none of
    them (MARS's env manager)."""

    report = "report"
    drop = "drop"


@dataclass
class MarsBatch:
    """How a step's batch is formed."""

    rule: MarsBatchRule = MarsBatchRule.mixture
    """mixture: ``tasks_per_step`` episodes, games by weight | first_finished: MARS's rule, the first
    2 x ``tasks_per_step`` rows (one per seat) to finish in ``env_slots`` environments playing back to back."""
    env_slots: list[int] = field(default_factory=list)
    """first_finished: environments per game of ``games``, in order (MARS: 32, 32, 32)."""
    episodes_per_slot: int = 0
    """first_finished: episodes per environment (0: ceil(rows / environments), ROLL's ``max_traj_per_env``)."""
    clock: Clock = Clock.tokens
    """first_finished: what times an environment: tokens (generated tokens) | turns (model calls)."""
    pre_turn_rewards: PreTurnRewards = PreTurnRewards.report
    """Rewards that reach a seat before its first turn: report (credited to that turn) | drop (MARS's env
    manager; the paper config)."""


def episode_duration(trajs: Sequence[Trajectory], clock: str) -> int:
    """How long one environment took to play an episode (all its seats' turns)."""
    if clock == Clock.turns:
        return sum(len(t.turns) for t in trajs)
    return sum(t.num_response_tokens for t in trajs)


def first_finished(episodes: Sequence[Sequence[Sequence[Trajectory]]], rows: int, clock: str) -> list[Trajectory]:
    """The first `rows` rows to finish: ``episodes[slot][k]`` are the trajectories of slot's k-th episode, played
    back to back. An episode finishes at its slot's clock summed over its episodes so far; its rows arrive in
    seat order, a seat that never acted sends none (MARS's ``formulate_rollouts``)."""
    arrivals = []
    for slot, played in enumerate(episodes):
        clock_at = 0
        for k, trajs in enumerate(played):
            clock_at += episode_duration(trajs, clock)
            arrivals.append((clock_at, slot, k, trajs))
    arrivals.sort(key=lambda a: a[:3])
    out: list[Trajectory] = []
    for *_, trajs in arrivals:
        for t in sorted(trajs, key=lambda t: t.agent):
            if t.turns:
                out.append(t)
                if len(out) == rows:
                    return out
    return out


def slot_envs(games: Sequence[EnvSpec], env_slots: Sequence[int]) -> list[EnvSpec]:
    """One env spec per environment slot: game i's spec `env_slots[i]` times, in order."""
    if len(env_slots) != len(games) or any(n < 1 for n in env_slots):
        raise ConfigError(f"batch.env_slots: one count >= 1 per game of games ({len(games)}), got {list(env_slots)}")
    return [spec for spec, n in zip(games, env_slots) for _ in range(n)]


def check_batch(batch: MarsBatch, games: Sequence[EnvSpec], group_size: int) -> None:
    """MARS's rule needs one slot count per game and one play per task (ROLL's group_size 1)."""
    if batch.rule != MarsBatchRule.first_finished:
        return
    slot_envs(games, batch.env_slots)
    if group_size != 1:
        raise ConfigError("batch.rule first_finished: rollout.group_size must be 1 (MARS's group_size)")
    if batch.episodes_per_slot < 0:
        raise ConfigError(f"batch.episodes_per_slot must be >= 0, got {batch.episodes_per_slot}")


class FirstFinished:
    """MARS's batch rule for the shared trainer (`BATCH_RULES` ``first_finished``, rl/batch_rules.py): each
    slot's episodes drawn here, and of what they played the first `rows` rows to finish kept. ``cfg.envs`` are
    the games' env specs (one per game, `slot_envs` repeats them); ``cfg.batch`` is a `MarsBatch`."""

    def __init__(self, cfg, tasks=None):
        check_batch(cfg.batch, cfg.envs, cfg.rollout.group_size)
        self.seed, self.clock = cfg.seed, cfg.batch.clock
        self.slots = slot_envs(cfg.envs, cfg.batch.env_slots)
        self.rows = 2 * cfg.tasks_per_step
        self.per_slot = cfg.batch.episodes_per_slot or math.ceil(self.rows / len(self.slots))

    def draw(self, step: int) -> list[EpisodeSpec]:
        """Slot-major: each slot's episodes in turn, reset seeds from (seed, step) (MARS: a random group seed
        per environment plus the episode's index)."""
        rng = random.Random(self.seed * 1_000_003 + step)
        specs = []
        for slot, env in enumerate(self.slots):
            make = functools.partial(make_env, env.name, dict(env.kwargs))
            base = rng.randrange(2**31 - self.per_slot)
            specs += [EpisodeSpec(make, base + k, f"{step}-{slot}-{k}") for k in range(self.per_slot)]
        return specs

    def select(self, step: int, result: RolloutResult) -> RolloutResult:
        """The first rows to finish of ``draw(step)``'s episodes, played whole (`first_finished`)."""
        index = {s.group_id: i for i, s in enumerate(self.draw(step))}
        episodes: list[list[list[Trajectory]]] = [[[] for _ in range(self.per_slot)] for _ in self.slots]
        for t in result.trajectories:
            i = index[t.group_id]
            episodes[i // self.per_slot][i % self.per_slot].append(t)
        kept = first_finished(episodes, self.rows, self.clock)
        return RolloutResult(kept, {**result.stats, "played_trajectories": len(result.trajectories)})


def credit_pre_turn_rewards(trajs: Sequence[Trajectory], rule: PreTurnRewards) -> list[Trajectory]:
    """The rows with what reached each seat before its first turn kept (report) or set to 0 (drop)."""
    if rule == PreTurnRewards.report:
        return list(trajs)
    return [replace(t, extra_reward=0.0) if t.extra_reward else t for t in trajs]


class MarsRows:
    """``mars.train``'s batch rule (`BATCH_RULES` ``mars_rows``): the rows of ``batch.rule`` (the drawn tasks, or
    `FirstFinished`), each credited by ``batch.pre_turn_rewards``."""

    def __init__(self, cfg, tasks=None):
        first = cfg.batch.rule == MarsBatchRule.first_finished
        self.rows = FirstFinished(cfg, tasks) if first else AllRows(cfg, tasks)
        self.pre_turn = cfg.batch.pre_turn_rewards

    def draw(self, step: int) -> list[EpisodeSpec]:
        return self.rows.draw(step)

    def select(self, step: int, result: RolloutResult) -> RolloutResult:
        kept = self.rows.select(step, result)
        return RolloutResult(credit_pre_turn_rewards(kept.trajectories, self.pre_turn), kept.stats)
