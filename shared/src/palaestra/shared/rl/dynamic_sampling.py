"""DAPO's dynamic sampling: drop the groups whose rewards are all equal and draw more tasks to replace them.

A GRPO group whose rewards are all equal has zero advantages and teaches nothing. DAPO (Yu et al. 2025, "Dynamic
Sampling") over-samples and filters out the prompts whose accuracy is 1 or 0; verl's ``algorithm.filter_groups``
(recipe/dapo) keeps drawing generation batches until the train batch has enough groups, up to
``max_num_gen_batches``, then keeps the first ``train_batch_size`` of them. Here, with ``dynamic_sampling.enabled``:

- a group is a task's trajectories (one group id); it is *mixed* when, for some agent, the total rewards of its
  usable trajectories (not failed, with response tokens) differ by more than ``tolerance`` (default 0: exact);
- the step's first rollout is filtered; while fewer than ``tasks_per_step`` mixed groups are kept, an extra draw
  of ``tasks_per_step`` new tasks is played on the same rollouts (at most ``max_extra_draws``; unlimited is not
  allowed) and filtered the same way; the batch is the first ``tasks_per_step`` mixed groups, in draw order;
- at the cap a one-line warning is logged and the batch is filled up to ``tasks_per_step`` groups with dropped
  ones (first drawn first), so the step keeps its size and the run goes on (verl raises instead);
- metrics per step: ``batch/groups_drawn``, ``batch/groups_dropped`` (all-equal groups seen),
  ``batch/groups_dropped_share``, ``batch/draws`` (the first included) and ``batch/groups_padded``; with
  several envs, on or off, ``batch/source_share/<env>``: each env's share of the batch's groups (rl/task_sampling.py);
  on or off, ``batch/mixed_groups_share`` and ``batch/pass_at_k`` of the batch (`DynamicSampler.batch_metrics`).

Extra draw ``j`` of step ``s`` is a function of (seed, s, j) only, so a resumed run draws the same tasks: with
``task_sampling: replacement`` envs by weight and reset seeds as `episodes.draw_tasks`; with ``epochs`` tasks
drawn uniformly from all tasks (they do not advance the epoch order; with ``epoch_mixture: weights``, or
after a pilot pass, an env by weight and one of its tasks: `TaskSampler.random_tasks`). Refused at resolve
time: ``group_size`` 1 (a group of one is never mixed), ``rollout.max_staleness`` > 0 and several ``policies``.
Off by default: the step is then exactly the one without this module.
"""

from __future__ import annotations

import functools
import logging
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from palaestra.shared.rollout.engine import EpisodeSpec, RolloutResult

if TYPE_CHECKING:
    from palaestra.shared.rl.config import TrainConfig
    from palaestra.shared.rl.task_sampling import TaskSampler

log = logging.getLogger(__name__)


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (rl/dynamic_sampling.py): drop groups whose rewards are all equal, draw more."""

    enabled: bool = False
    """Filter groups and draw more tasks (DAPO: on; off: the step as without this section)."""
    tolerance: float = 0.0
    """Rewards within this of each other count as equal (0: exactly equal)."""
    max_extra_draws: int = 3
    """Extra draws of ``tasks_per_step`` tasks per step at most (verl's ``max_num_gen_batches`` minus the first);
    >= 1 (unlimited is not allowed)."""


def check_dynamic_sampling(value: DynamicSamplingConfig, owner: TrainConfig) -> str | None:
    """The combinations dynamic sampling cannot run; one line each."""
    if not value.enabled:
        return None
    if value.tolerance < 0:
        return f"tolerance must be >= 0, got {value.tolerance}"
    if value.max_extra_draws < 1:
        return f"max_extra_draws must be >= 1 (unlimited is not allowed), got {value.max_extra_draws}"
    if owner.rollout.group_size < 2:
        return f"needs rollout.group_size >= 2 (a group of {owner.rollout.group_size} never has mixed rewards)"
    if owner.rollout.max_staleness > 0:
        return (
            f"is not supported with rollouts ahead (rollout.max_staleness={owner.rollout.max_staleness}): set it to 0"
        )
    if owner.policies:
        return f"is not supported with several policies (policies: {', '.join(owner.policies)})"
    return None


def group_rewards(result: RolloutResult) -> dict[str, dict[str, list[float]]]:
    """Per group id (in first-seen order), per agent, the total rewards of its usable trajectories."""
    groups: dict[str, dict[str, list[float]]] = {}
    for t in result.trajectories:
        agents = groups.setdefault(t.group_id, defaultdict(list))
        if not t.failed and t.num_response_tokens > 0:
            agents[t.agent].append(t.total_reward)
    return groups


def is_mixed(agents: dict[str, list[float]], tolerance: float = 0.0) -> bool:
    """Some agent's rewards differ by more than `tolerance` (so GRPO gives some of them a non-zero advantage)."""
    return any(len(r) > 1 and max(r) - min(r) > tolerance for r in agents.values())


def merge_stats(parts: list[dict[str, float]]) -> dict[str, float]:
    """The stats of rollouts played one after the other: counts and seconds add up."""
    out: dict[str, float] = {}
    for stats in parts:
        for k, v in stats.items():
            out[k] = out.get(k, 0) + v
    return out


class DynamicSampler:
    """The trainer's dynamic sampling (``cfg.dynamic_sampling``); `fill` is a pass-through when it is off."""

    def __init__(self, cfg: TrainConfig, tasks: TaskSampler):
        self.cfg, self.tasks = cfg, tasks
        self.opts: DynamicSamplingConfig = cfg.dynamic_sampling

    def extra_tasks(self, step: int, draw: int) -> list[EpisodeSpec]:
        """Extra draw `draw` (1, 2, ...) of step `step`: ``tasks_per_step`` tasks, a function of (seed, step, draw)."""
        from palaestra.shared.rl.config import TaskSampling
        from palaestra.shared.rl.episodes import make_env

        cfg = self.cfg
        rng = random.Random(f"dynamic-sampling/{cfg.seed}/{step}/{draw}")
        name = lambda i: f"{step}-x{draw}-{i}"  # noqa: E731
        if cfg.task_sampling == TaskSampling.epochs or self.tasks.filtered:  # the sampler's pools
            return self.tasks.specs(self.tasks.random_tasks(rng, cfg.tasks_per_step), name)
        picks: list[tuple[Any, int]] = []
        weights = [e.weight for e in cfg.envs]
        for _ in range(cfg.tasks_per_step):
            env = rng.choices(cfg.envs, weights=weights)[0]
            picks.append((env, rng.randrange(cfg.task_seeds) if cfg.task_seeds else rng.randrange(2**31)))
        return [
            EpisodeSpec(functools.partial(make_env, env.name, dict(env.kwargs)), seed, name(i))
            for i, (env, seed) in enumerate(picks)
        ]

    def fill(self, step: int, played: RolloutResult, rollouts: Any, batch_rule: Any) -> tuple[RolloutResult, dict]:
        """Step `step`'s batch: the rows `batch_rule` keeps (its ``select``) of the step's rollout `played`, and
        with dynamic sampling of extra draws played on `rollouts` (``run(specs, seed)``), filtered; and the step's
        ``batch/...`` metrics ({} when off)."""
        first = batch_rule.select(step, played)
        if not self.opts.enabled:
            return first, self.batch_metrics(step, first, batch_rule, [])
        want, tol = self.cfg.tasks_per_step, self.opts.tolerance
        kept: list[str] = []
        dropped: list[str] = []
        results, draws, extra = [first], 1, []
        while True:
            for gid, agents in group_rewards(results[-1]).items():
                (kept if is_mixed(agents, tol) else dropped).append(gid)
            if len(kept) >= want or draws > self.opts.max_extra_draws:
                break
            seed = (self.cfg.seed * 100_003 + step) * 64 + draws  # apart from the step's own and the eval seeds
            specs = self.extra_tasks(step, draws)
            extra += specs
            results.append(batch_rule.select(step, rollouts.run(specs, seed=seed)))
            draws += 1
        chosen = kept[:want]
        padded = dropped[: max(0, want - len(chosen))]
        if padded:
            log.warning(
                "step %d: dynamic sampling kept %d of %d groups with mixed rewards after %d extra draws "
                "(dynamic_sampling.max_extra_draws); %d all-equal groups fill the batch",
                step,
                len(chosen),
                want,
                draws - 1,
                len(padded),
            )
        keep = set(chosen) | set(padded)
        trajs = [t for r in results for t in r.trajectories if t.group_id in keep]
        drawn = len(kept) + len(dropped)
        metrics = {
            "batch/groups_drawn": float(drawn),
            "batch/groups_dropped": float(len(dropped)),
            "batch/groups_dropped_share": len(dropped) / max(drawn, 1),
            "batch/draws": float(draws),
            "batch/groups_padded": float(len(padded)),
        }
        batch = RolloutResult(trajs, merge_stats([r.stats for r in results]))
        return batch, metrics | self.batch_metrics(step, batch, batch_rule, extra)

    def batch_metrics(
        self, step: int, batch: RolloutResult, batch_rule: Any, extra: list[EpisodeSpec]
    ) -> dict[str, float]:
        """What the batch's groups carry, on or off: ``batch/mixed_groups_share`` (groups with mixed rewards: a
        non-zero advantage), ``batch/pass_at_k`` (groups where some usable trajectory has total reward >= 1: pass@k
        at k = group size, for a 0/1 reward) and each env's share of them (``batch/source_share/<env>``)."""
        from palaestra.shared.rl.task_sampling import source_shares

        groups = group_rewards(batch)
        rewards = [[r for agent in g.values() for r in agent] for g in groups.values()]
        out = {
            "batch/mixed_groups_share": sum(is_mixed(g, self.opts.tolerance) for g in groups.values())
            / max(len(groups), 1),
            "batch/pass_at_k": sum(any(r >= 1 for r in g) for g in rewards) / max(len(groups), 1),
        }
        if len(self.cfg.envs) < 2:
            return out
        return out | source_shares(self.cfg, [*batch_rule.draw(step), *extra], set(groups))
