"""How the trainer draws each step's tasks (``task_sampling``), and the run's length that follows from it.

- ``replacement`` (`episodes.draw_tasks`): each task draws an env by mixture weight and a random reset seed;
  the run is ``steps`` steps.
- ``epochs``: as verl's dataloader (the EGPO paper trains "5 epochs"): an epoch of ``N`` tasks (``N``: every
  task of every env), in an order shuffled per epoch from ``(seed, epoch)``; step ``k`` takes the next
  ``tasks_per_step`` of that sequence (an epoch's tail continues into the next one's head). A task is an
  ``(env, index)`` pair; its reset seed is the index, which the task envs play as their sample ``index % count``.
  With ``epochs`` > 0 the run is ``ceil(epochs * N / tasks_per_step)`` steps (`epoch_steps`), else ``steps``.
  ``epoch_mixture`` says what each env's share of an epoch is:

  - ``counts`` (default): every task once per epoch, so an env's share is its task count over ``N`` (the env
    weights would be ignored, so unequal weights are refused at resolve time);
  - ``weights``: env ``e`` gets ``n_e`` of the epoch's ``N`` places, ``N * w_e / sum(w)`` rounded by largest
    remainder (ties to the first env), so ``|n_e - N w_e / sum(w)| < 1`` and the epoch's shares are the weights
    within ``1/N``. Its ``n_e`` tasks are the next ``n_e`` of the env's own stream: passes over its tasks, each
    shuffled from ``(seed, env, pass)``. An env under its count's share is sub-sampled without replacement
    across epochs (every task once before any repeats); one over it repeats its tasks (``n_e / count`` passes
    per epoch). verl has no per-source weights (it concatenates the files): this is our documented choice.

A pilot pass (rl/pilot.py) may restrict each env to a subset of its tasks (`TaskSampler.set_pool`); both draws
then use only those tasks (with replacement: an env by weight, one of its kept tasks uniformly).

With more than one env, each step's batch logs ``batch/source_share/<env>`` (its share of the batch's tasks;
`source_shares`; ``<env>`` is the env's name, with ``.<i>`` when two envs share a name).

>>> epoch_steps(epochs=5, num_tasks=17_000, tasks_per_step=128)
665
>>> mixture_sizes(40, [1.0, 1.0, 1.0])
[14, 13, 13]
"""

from __future__ import annotations

import functools
import math
import random
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from palaestra.shared.rl.config import EpochMixture, TaskSampling, TrainConfig
from palaestra.shared.rl.episodes import draw_tasks, make_env
from palaestra.shared.rollout.engine import EpisodeSpec

if TYPE_CHECKING:
    from palaestra.shared.rl.config import EnvSpec


def epoch_steps(epochs: int, num_tasks: int, tasks_per_step: int) -> int:
    """Steps for `epochs` passes over `num_tasks` tasks at `tasks_per_step` per step."""
    if epochs <= 0 or num_tasks <= 0 or tasks_per_step <= 0:
        raise ValueError(f"epochs, tasks and tasks_per_step must be > 0 (got {epochs}, {num_tasks}, {tasks_per_step})")
    return math.ceil(epochs * num_tasks / tasks_per_step)


def mixture_sizes(total: int, weights: list[float]) -> list[int]:
    """`total` places split by `weights` (largest remainder, ties to the first): they sum to `total`."""
    quotas = [total * w / sum(weights) for w in weights]
    sizes = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda e: (-(quotas[e] - sizes[e]), e))
    for e in by_remainder[: total - sum(sizes)]:
        sizes[e] += 1
    return sizes


def task_count(env) -> int:
    """How many distinct tasks an env plays (`TaskEnv`: its samples; others: a ``num_tasks`` attribute)."""
    count = getattr(env, "num_tasks", None)
    if count is None:
        count = len(getattr(env, "samples", None) or [])
    if not count:
        raise ValueError(
            f"task_sampling=epochs: env {type(env).__name__} does not say how many tasks it has (num_tasks)"
        )
    return int(count)


def source_labels(envs: list[EnvSpec]) -> list[str]:
    """Each env's name in metrics: its registry name, with ``.<index>`` where two envs share it."""
    names = Counter(e.name for e in envs)
    return [e.name if names[e.name] == 1 else f"{e.name}.{i}" for i, e in enumerate(envs)]


def check_epoch_mixture(value: EpochMixture, owner: TrainConfig) -> str | None:
    """Weights that would be silently ignored, or that cannot be a mixture; one line each."""
    weights = [e.weight for e in owner.envs]
    if any(w < 0 for w in weights) or not sum(weights) > 0:
        return f"env weights must be >= 0 with a positive sum, got {weights}"
    if value == EpochMixture.weights and owner.task_sampling != TaskSampling.epochs:
        return f"weights needs task_sampling: epochs (got {owner.task_sampling}, which draws envs by weight already)"
    if value == EpochMixture.counts and owner.task_sampling == TaskSampling.epochs and len(set(weights)) > 1:
        return (
            f"counts gives each env its task count's share and would ignore the env weights {weights}: "
            "set epoch_mixture: weights, or drop the weights"
        )
    return None


class TaskSampler:
    """This run's draw of tasks (``cfg.task_sampling``); with ``epochs`` the envs are built once to count tasks."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.pools: list[list[int]] = []  # per env, the task indices drawn from (epochs, or after a pilot pass)
        self.filtered = False  # a pilot pass set the pools
        if cfg.task_sampling == TaskSampling.epochs:
            self.pools = [list(range(task_count(make_env(e.name, dict(e.kwargs))))) for e in cfg.envs]
        self._orders: dict[int, list[tuple[int, int]]] = {}

    @property
    def task_counts(self) -> list[int]:
        """Tasks per env drawn from (``epochs`` or a pilot's pools; [] with ``replacement`` alone)."""
        return [len(p) for p in self.pools]

    @property
    def num_tasks(self) -> int:
        """Distinct tasks of all envs (``epochs``; 0 with ``replacement``, which does not count them)."""
        return sum(self.task_counts)

    def set_pool(self, pools: list[list[int]]) -> None:
        """Draw only these task indices of each env from now on (the pilot pass's kept tasks)."""
        if len(pools) != len(self.cfg.envs) or not any(pools):
            raise ValueError(f"a pool per env ({len(self.cfg.envs)}), not all empty, is needed; got {pools}")
        self.pools, self.filtered, self._orders = [sorted(p) for p in pools], True, {}

    def steps(self) -> int:
        """The run's RL steps: ``cfg.steps``, or with ``epochs`` > 0 the steps of that many passes."""
        if self.cfg.task_sampling == TaskSampling.epochs and self.cfg.epochs > 0:
            return epoch_steps(self.cfg.epochs, self.num_tasks, self.cfg.tasks_per_step)
        return self.cfg.steps

    def weights(self) -> list[float]:
        """The env weights, 0 for an env with no task left in its pool."""
        if not self.pools:
            return [e.weight for e in self.cfg.envs]
        return [e.weight if pool else 0.0 for e, pool in zip(self.cfg.envs, self.pools, strict=True)]

    def epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        """The epoch's ``(env index, task index)`` places, shuffled from ``(seed, epoch)`` (`epoch_mixture`)."""
        if epoch not in self._orders:
            if self.cfg.epoch_mixture == EpochMixture.weights:
                sizes = mixture_sizes(self.num_tasks, self.weights())
                order = [(e, i) for e, n in enumerate(sizes) for i in self._env_stream(e, epoch * n, n)]
            else:
                order = [(e, i) for e, pool in enumerate(self.pools) for i in pool]
            random.Random(self.cfg.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # one epoch at a time is enough: steps move forward
        return self._orders[epoch]

    def _env_stream(self, env: int, start: int, n: int) -> list[int]:
        """Items ``start .. start + n - 1`` of env `env`'s stream: passes over its pool, each shuffled."""
        pool, out = self.pools[env], []
        for p in range(start // len(pool), (start + n - 1) // len(pool) + 1) if n else ():
            one = list(pool)
            random.Random(f"epoch-mixture/{self.cfg.seed}/{env}/{p}").shuffle(one)
            lo, hi = max(start - p * len(pool), 0), min(start + n - p * len(pool), len(pool))
            out += one[lo:hi]
        return out

    def draw(self, step: int) -> list[EpisodeSpec]:
        """The tasks of step `step` (a function of the config, the pools and the step)."""
        if self.cfg.task_sampling != TaskSampling.epochs:
            if not self.filtered:
                return draw_tasks(self.cfg, step)
            rng = random.Random(self.cfg.seed * 1_000_003 + step)
            return self.specs(self.random_tasks(rng, self.cfg.tasks_per_step), lambda j: f"{step}-{j}")
        per_step, total = self.cfg.tasks_per_step, self.num_tasks
        picks = [self.epoch_order(k // total)[k % total] for k in range(step * per_step, (step + 1) * per_step)]
        return self.specs(picks, lambda j: f"{step}-{j}")

    def random_tasks(self, rng: random.Random, n: int) -> list[tuple[int, int]]:
        """`n` random ``(env index, task index)`` from the pools: uniform over all tasks without replacement
        (``epoch_mixture: counts``), else each an env by weight and one of its tasks uniformly."""
        if self.cfg.task_sampling == TaskSampling.epochs and self.cfg.epoch_mixture == EpochMixture.counts:
            flat = [(e, i) for e, pool in enumerate(self.pools) for i in pool]
            return [flat[k] for k in rng.sample(range(len(flat)), min(n, len(flat)))]
        envs, weights = range(len(self.pools)), self.weights()
        return [(e, rng.choice(self.pools[e])) for e in (rng.choices(envs, weights=weights)[0] for _ in range(n))]

    def specs(self, picks: Iterable[tuple[int, int]], group_id: Any) -> list[EpisodeSpec]:
        """An `EpisodeSpec` per ``(env index, task index)``; `group_id(j)` names the j-th."""
        out = []
        for j, (e, index) in enumerate(picks):
            env = self.cfg.envs[e]
            out.append(EpisodeSpec(functools.partial(make_env, env.name, dict(env.kwargs)), index, group_id(j)))
        return out


def spec_env(cfg: TrainConfig, spec: EpisodeSpec) -> int | None:
    """The index of the env a spec plays (its ``make_env`` is ``partial(make_env, name, kwargs)``), or None."""
    args = getattr(spec.make_env, "args", None)
    for i, e in enumerate(cfg.envs):
        if args == (e.name, dict(e.kwargs)):
            return i
    return None


def source_shares(cfg: TrainConfig, specs: Iterable[EpisodeSpec], group_ids: set[str]) -> dict[str, float]:
    """``batch/source_share/<env>``: each env's share of the tasks (groups) in `group_ids`, read from the specs
    that drew them ({} with one env, or when no spec is known)."""
    if len(cfg.envs) < 2:
        return {}
    envs = {s.group_id: spec_env(cfg, s) for s in specs}
    counts = Counter(envs[g] for g in group_ids if envs.get(g) is not None)
    total = sum(counts.values())
    if not total:
        return {}
    return {f"batch/source_share/{label}": counts[i] / total for i, label in enumerate(source_labels(cfg.envs))}
