"""Rollouts ahead of the learner, with bounded staleness (``rollout.max_staleness`` k), and their metrics.

The trainer asks a `RolloutStream` for each step's rollout (`take`) and hands it the weights after each
update (`sync`). With k = 0 that is the synchronous loop exactly: `take(t)` runs step t's tasks and
returns when they end; `sync` pushes the weights between rollouts.

Protocol with k > 0:

1. Admission: `take(t)` first starts, in order, the steps s <= t + k of the run not started yet (its tasks
   ``draw(s)`` and seed ``seed(s)``: the tasks and seeds of the synchronous run). So at most k + 1 steps of
   episodes are in flight; nothing is ever discarded for being stale. ``rollout.max_inflight`` bounds a task
   source's tasks in flight (its name: the env's, or the ``task`` env's ``source``): a step ahead that would
   exceed a bound waits, and it and the steps after it start at a later `take` (step t itself always starts).
2. Overlap: `take(t)` then waits for step t only. While the learner updates on step t, steps t+1..t+k
   generate: on the Ray workers (each worker runs its rollouts and takes weights at once), or, for
   in-process rollouts, in one background thread over a copy of the policy (the learner's own model changes
   during the update; several policies: a copy of each, `background_engine`).
3. Versions: the policy version is the learner's step count. After the update of step t, `sync` hands
   version t + 1 to the rollouts. ``rollout.version_schedule``:
   - ``newest``: every rollout client loads it before its next generate call (rollout/policy_version.py).
     An episode in flight, a multi-turn one half played, continues with the new weights, and every token
     keeps the version that sampled it (`Turn.response_versions`). A token of step s's rollout was sampled
     at version >= s - k, so its lag at the update of step s is at most k. Which call takes the new weights
     depends on timing: runs are not reproducible.
   - ``fixed``: a rollout samples all its tokens with the version that is newest when it starts (Ray:
     `RayRollouts` ``pin_versions``; in-process: the background thread loads it before the rollout). Step
     s starts at ``take(s - k)``, so it samples with version max(0, s - k) (later when admission control
     defers it): the run is a function of its config, as the synchronous one.
4. Groups: a step's result comes back when all its episodes ended, so a GRPO group is scored when its
   last member ends, never from a part of it.
5. Workers that die: their shard runs again, whole and with the same seed, on a replacement that gets the
   current weights (pinned: the shard's own) (`RayRollouts.collect`): no episode lost or counted twice.
6. Correction: the loss may correct the behaviour-vs-learner gap per token (``loss.behaviour_correction``
   tis | mis, rl/loss.py) with the sampler's log-probs (`behaviour_tensors`); `async_metrics` reports the
   staleness histogram, the share of tokens truncated or masked, and the log-prob gap.
7. Checkpoints: `save` waits for the rollouts in flight and writes their results into the checkpoint;
   `restore` takes them back, so a resumed run trains on the same rollouts as the run that saved (with the
   ``fixed`` schedule, bit for bit the uninterrupted run).

In-process rollouts share torch's global random state with anything else that samples in this process
(an evaluation between steps): with k > 0 and an evaluation hook such runs are not reproducible.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import pickle
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from palaestra.shared.config import ConfigError
from palaestra.shared.llm.base import DType
from palaestra.shared.rl.batch import TrainBatch, batch_rows
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.loss import LossConfig, behaviour_weights
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutResult, VersionSchedule
from palaestra.shared.rollout.serving import ModelServing, Serving
from palaestra.shared.rollout.trajectory import Trajectory
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts, Replica, map_tensors

Rollouts = LocalRollouts | RayRollouts
AHEAD_FILE = "rollouts_ahead.pkl"
"""The results of the rollouts in flight at a checkpoint (a step's directory)."""


def task_source(spec: EpisodeSpec) -> str:
    """The task source an episode draws from, as ``rollout.max_inflight`` names it: the env's registered name
    (``functools.partial(make_env, name, kwargs)``, rl/episodes.py), or the ``task`` env's ``source``."""
    make = spec.make_env
    if isinstance(make, functools.partial) and len(make.args) == 2 and isinstance(make.args[0], str):
        name, kwargs = make.args
        return str(kwargs.get("source", name)) if name == "task" and isinstance(kwargs, dict) else name
    return getattr(make, "__name__", type(make).__name__)


def config_sources(cfg: TrainConfig) -> set[str]:
    """The task sources of the run's env mixture (`task_source` of its specs)."""
    return {str(e.kwargs.get("source", e.name)) if e.name == "task" else e.name for e in cfg.envs}


def check_admission(cfg: TrainConfig) -> None:
    """``rollout.max_inflight`` names sources of the mixture, with bounds >= 1."""
    limits, known = cfg.rollout.max_inflight, config_sources(cfg)
    unknown = sorted(set(limits) - known)
    if unknown:
        raise ConfigError(f"rollout.max_inflight names {unknown}, not task sources of envs (they are {sorted(known)})")
    bad = {k: v for k, v in limits.items() if v < 1}
    if bad:
        raise ConfigError(f"rollout.max_inflight bounds must be >= 1 (got {bad})")


class RolloutStream:
    """Each step's rollout, up to `max_staleness` steps ahead of the learner (module docstring)."""

    def __init__(
        self,
        rollouts: Rollouts,
        max_staleness: int,
        draw: Callable[[int], list[EpisodeSpec]],
        seed: Callable[[int], int],
        local_engine: Callable[[], Replica] | None = None,
        steps: int | None = None,
        schedule: VersionSchedule = VersionSchedule.newest,
        max_inflight: dict[str, int] | None = None,
    ):
        """`local_engine` builds the background engine over a copy of the policy (in-process rollouts, k > 0);
        `steps`: the run's steps (none is started past the last one; None: no end); `schedule`, `max_inflight`:
        ``rollout.version_schedule`` and ``rollout.max_inflight``."""
        self.rollouts, self.k, self.draw, self.seed = rollouts, max_staleness, draw, seed
        self.steps, self.schedule = steps, VersionSchedule(schedule)
        self.limits = dict(max_inflight or {})
        self.inflight: dict[int, Any] = {}  # step -> its handle (a future, a Ray handle, or its result)
        self.drawn: dict[int, list[EpisodeSpec]] = {}  # drawn, not admitted yet
        self.sources: dict[int, Counter[str]] = {}  # the bounded sources' tasks of each step in flight
        self.pinned: tuple[dict[str, Any], int] | None = None  # fixed, in-process: the newest weights
        self.engine: Replica | None = None
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        if self.k > 0 and isinstance(rollouts, LocalRollouts):
            assert local_engine is not None, "in-process rollouts ahead of the learner need their own engine"
            self.engine = local_engine()
            self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts")

    @property
    def needs_weights(self) -> bool:
        """Whether `sync` must be given the weights (Ray workers, or the background engine's copy)."""
        return isinstance(self.rollouts, RayRollouts) or self.engine is not None

    def take(self, step: int) -> RolloutResult:
        """Step `step`'s rollout (started now if it is not in flight), after starting steps up to step + k."""
        if self.k == 0 and step not in self.inflight:
            return self.rollouts.run(self.draw(step), seed=self.seed(step))
        last = step + self.k + 1 if self.steps is None else max(step + 1, min(step + self.k + 1, self.steps))
        for s in range(step, last):
            if s in self.inflight:
                continue
            if s > step and not self._admits(s):
                break  # steps start in order: this one and those after it wait for a later take
            self.sources[s] = self._bounded(self._specs(s))
            self.inflight[s] = self._submit(s)
        self.sources.pop(step, None)
        return self._result(self.inflight.pop(step))

    def _specs(self, step: int) -> list[EpisodeSpec]:
        if step not in self.drawn:
            self.drawn[step] = self.draw(step)
        return self.drawn[step]

    def _bounded(self, specs: list[EpisodeSpec]) -> Counter[str]:
        """The tasks of `specs` per source that ``max_inflight`` bounds."""
        return Counter(name for name in map(task_source, specs) if name in self.limits)

    def _admits(self, step: int) -> bool:
        """Whether `step`'s tasks fit under every source's bound beside the steps in flight."""
        if not self.limits:
            return True
        busy = sum(self.sources.values(), Counter())
        wants = self._bounded(self._specs(step))
        return all(busy[name] + n <= self.limits[name] for name, n in wants.items())

    def _submit(self, step: int) -> Any:
        specs, seed = self.drawn.pop(step), self.seed(step)
        if self.pool is not None:
            assert self.engine is not None
            pinned = self.pinned if self.schedule == VersionSchedule.fixed else None
            return self.pool.submit(self._run_local, specs, seed, pinned)
        assert isinstance(self.rollouts, RayRollouts)
        return self.rollouts.submit(specs, seed)

    def _run_local(self, specs: list[EpisodeSpec], seed: int, pinned: tuple | None) -> RolloutResult:
        assert self.engine is not None
        if pinned is not None:  # fixed: the weights newest at submission (the thread runs rollouts in order)
            self.engine.load_now(*pinned)
        return self.engine.run(specs, seed)

    def _result(self, handle: Any) -> RolloutResult:
        if isinstance(handle, RolloutResult):
            return handle
        if isinstance(handle, concurrent.futures.Future):
            return handle.result()
        assert isinstance(self.rollouts, RayRollouts)
        return self.rollouts.collect(handle)

    def sync(self, state: Callable[[], dict[str, Any]], version: int) -> None:
        """The policy of `version` (its weights from `state()`, read only where a client needs a copy; several
        policies': by policy or adapter)."""
        if self.engine is not None:
            # a copy: the learner updates its tensors in place while the background engine may still load them
            weights = map_tensors(state(), lambda t: t.detach().clone())
            if self.schedule == VersionSchedule.fixed:
                self.pinned = (weights, version)  # for the rollouts submitted from now on
            else:
                self.engine.offer(weights, version)  # loaded before the background engine's next call
            self.rollouts.sync(None, version)
            return
        self.rollouts.sync(state() if self.needs_weights else None, version)

    def drain(self) -> dict[int, RolloutResult]:
        """Wait for the rollouts in flight; they stay in flight as their results, which this returns."""
        for step in sorted(self.inflight):
            self.inflight[step] = self._result(self.inflight[step])
        return dict(self.inflight)

    def save(self, directory: Path) -> None:
        """Write the rollouts in flight (waited for) into a checkpoint's directory."""
        ahead = self.drain()
        if not ahead:
            return
        try:
            data = pickle.dumps(ahead)
        except (pickle.PicklingError, TypeError, AttributeError) as err:  # an env's info that does not pickle
            again = f"a resumed run starts steps {sorted(ahead)} again"
            warnings.warn(f"rollouts in flight not saved ({err}): {again}", stacklevel=2)
            return
        (Path(directory) / AHEAD_FILE).write_bytes(data)

    def restore(self, directory: Path | None) -> None:
        """Take back the rollouts in flight at the checkpoint `directory` (none there: nothing to take)."""
        path = Path(directory) / AHEAD_FILE if directory is not None else None
        if path is None or not path.is_file():
            return
        with open(path, "rb") as f:
            ahead: dict[int, RolloutResult] = pickle.load(f)
        self.inflight.update(ahead)
        for step in ahead:
            self.sources[step] = self._bounded(self.draw(step)) if self.limits else Counter()

    def close(self) -> None:
        """Stop the background thread (the rollouts in flight are dropped: a resumed run takes back those a
        checkpoint saved, or starts them again)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.inflight.clear()
        self.sources.clear()


def background_engine(cfg: TrainConfig, state: dict[str, Any], version: int, serving: Serving | None = None) -> Replica:
    """An engine over its own copy of the policy (``llm``, loaded with `state` of `version`): in-process
    rollouts ahead of the learner cannot share the model the learner is updating. Several policies
    (`serving`, rollout/serving.py): a copy of each policy's model or of the base with every policy's
    adapter, each agent's turns on its policy's (rollout/workers.py `Replica`)."""
    float32 = lambda llm: dataclasses.replace(llm, dtype=DType.float32)  # noqa: E731  (as the learner's)
    if isinstance(serving, ModelServing):
        serving = serving.with_llm(float32)
    replica = Replica(float32(cfg.llm), cfg.rollout, serving)
    replica.load_now(state, version)
    return replica


def behaviour_tensors(
    trajs: list[Trajectory], shape: tuple[int, ...], split: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L-1) over the batch's target positions (`rl/batch.py`, its rows `batch_rows(trajs, split)`): the
    sampler's log-prob of each model token (NaN where the backend gave none) and the policy version that sampled
    it (-1 off the model's tokens)."""
    logps = torch.full(shape, float("nan"))
    versions = torch.full(shape, -1, dtype=torch.long)
    for row, (_, seq) in enumerate(batch_rows(trajs, split)):
        k = len(seq.input_ids)
        lp = [float("nan") if v is None else v for v in seq.sampler_logprobs[1:]]
        logps[row, : k - 1] = torch.tensor(lp, dtype=torch.float32)
        versions[row, : k - 1] = torch.tensor(seq.versions[1:], dtype=torch.long)
    return logps, versions


def behaviour_data(
    trajs: list[Trajectory],
    batch: TrainBatch,
    cfg: TrainConfig,
    step: int,
    old_logps: torch.Tensor | None,
    split: bool = False,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """A step's sampler log-probs for ``loss.behaviour_correction`` (None when it is off; 0 off the model's
    tokens) and its `async_metrics` (the learner at version `step`, before its update: `old_logps`)."""
    behaviour, versions = behaviour_tensors(trajs, tuple(batch.loss_mask.shape), split)
    metrics = async_metrics(step, versions, batch.loss_mask, cfg.rollout.max_staleness, cfg.loss, old_logps, behaviour)
    if cfg.loss.behaviour_correction == "off":
        return None, metrics
    if torch.isnan(behaviour[batch.loss_mask > 0]).any():
        raise ValueError("loss.behaviour_correction needs the rollout backend's log-probs (it returned none)")
    return behaviour.nan_to_num(0.0), metrics


def async_metrics(
    learner_version: int,
    versions: torch.Tensor,
    mask: torch.Tensor,
    max_staleness: int,
    cfg: LossConfig,
    old_logps: torch.Tensor | None = None,
    behaviour_logps: torch.Tensor | None = None,
) -> dict[str, float]:
    """A step's ``async/`` metrics over its model tokens (`mask`): staleness (learner version - token version)
    mean, max and token counts per lag 0..k; with both log-probs, the learner-minus-behaviour log-prob gap
    (mean and mean absolute) and the shares of tokens the correction truncates (w > C) and masks
    (w outside [1/C, C]), whichever mode is on."""
    on = mask > 0
    lag = (learner_version - versions[on]).float()
    out: dict[str, float] = {
        "async/staleness_mean": float(lag.mean()) if lag.numel() else 0.0,
        "async/staleness_max": float(lag.max()) if lag.numel() else 0.0,
    }
    for j in range(max_staleness + 1):
        out[f"async/tokens_lag_{j}"] = float((lag == j).sum())
    if old_logps is not None and behaviour_logps is not None:
        gap = (old_logps - behaviour_logps)[on]
        gap = gap[torch.isfinite(gap)]
        ratio = torch.exp(gap)
        c = cfg.behaviour_threshold
        tokens = max(gap.numel(), 1)
        out["async/logp_gap_mean"] = float(gap.mean()) if gap.numel() else 0.0
        out["async/logp_gap_abs"] = float(gap.abs().mean()) if gap.numel() else 0.0
        out["async/truncated_share"] = float((ratio > c).sum()) / tokens
        out["async/masked_share"] = float(((ratio > c) | (ratio < 1 / c)).sum()) / tokens
        _, acted = behaviour_weights(old_logps[on], behaviour_logps[on], cfg)
        out["async/corrected_share"] = float(acted.sum()) / tokens  # of the mode that is on (0: off)
    return out
