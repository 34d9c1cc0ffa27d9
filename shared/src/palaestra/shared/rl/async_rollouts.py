"""Rollouts ahead of the learner, with bounded staleness (``rollout.max_staleness`` k), and their metrics.

The trainer asks a `RolloutStream` for each step's rollout (`take`) and hands it the weights after each
update (`sync`). With k = 0 that is the synchronous loop exactly: `take(t)` runs step t's tasks and
returns when they end; `sync` pushes the weights between rollouts.

Protocol with k > 0:

1. Admission: `take(t)` first starts every step s <= t + k of the run not started yet (its tasks
   ``draw(s)`` and seed ``seed(s)``: the tasks and seeds of the synchronous run). So at most k + 1 steps of episodes are
   in flight, each step's mixture of task sources as drawn (the admission bound holds per source in
   that proportion); nothing is ever discarded for being stale.
2. Overlap: `take(t)` then waits for step t only. While the learner updates on step t, steps t+1..t+k
   generate: on the Ray workers (a concurrent actor pool: each worker runs its rollouts and takes weights
   at once), or, for in-process rollouts, in one background thread over a copy of the policy (the
   learner's own model changes during the update).
3. Versions: the policy version is the learner's step count. After the update of step t, `sync` offers
   version t + 1 to every rollout client; each loads it before its next generate call
   (rollout/policy_version.py). An episode in flight, a multi-turn one half played, continues with the
   new weights, and every token keeps the version that sampled it (`Turn.response_versions`). A token of
   step s's rollout was sampled at version >= s - k, so its lag at the update of step s is at most k.
4. Groups: a step's result comes back when all its episodes ended, so a GRPO group is scored when its
   last member ends, never from a part of it.
5. Workers that die: their shard runs again, whole and with the same seed, on a replacement that gets the
   current weights (`RayRollouts.collect`): no episode lost or counted twice.
6. Correction: the loss may correct the behaviour-vs-learner gap per token (``loss.behaviour_correction``
   tis | mis, rl/loss.py) with the sampler's log-probs (`behaviour_tensors`); `async_metrics` reports the
   staleness histogram, the share of tokens truncated or masked, and the log-prob gap.

The in-flight rollouts of a checkpoint are not saved: a resumed run starts them again from the resumed
weights (bit-exact resume needs k = 0).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from palaestra.shared.llm.base import DType, make_client
from palaestra.shared.rl.batch import TrainBatch
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.loss import LossConfig, behaviour_weights
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutEngine, RolloutResult
from palaestra.shared.rollout.trajectory import Trajectory
from palaestra.shared.rollout.workers import LocalRollouts, RayRollouts

Rollouts = LocalRollouts | RayRollouts


class RolloutStream:
    """Each step's rollout, up to `max_staleness` steps ahead of the learner (module docstring)."""

    def __init__(
        self,
        rollouts: Rollouts,
        max_staleness: int,
        draw: Callable[[int], list[EpisodeSpec]],
        seed: Callable[[int], int],
        local_engine: Callable[[], RolloutEngine] | None = None,
        steps: int | None = None,
    ):
        """`local_engine` builds the background engine over a copy of the policy (in-process rollouts, k > 0);
        `steps`: the run's steps (none is started past the last one; None: no end)."""
        self.rollouts, self.k, self.draw, self.seed = rollouts, max_staleness, draw, seed
        self.steps = steps
        self.inflight: dict[int, Any] = {}
        self.engine: RolloutEngine | None = None
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
        if self.k == 0:
            return self.rollouts.run(self.draw(step), seed=self.seed(step))
        last = step + self.k + 1 if self.steps is None else max(step + 1, min(step + self.k + 1, self.steps))
        for s in range(step, last):
            if s not in self.inflight:
                self.inflight[s] = self._submit(s)
        handle = self.inflight.pop(step)
        if self.pool is not None:
            return handle.result()
        assert isinstance(self.rollouts, RayRollouts)
        return self.rollouts.collect(handle)

    def _submit(self, step: int) -> Any:
        specs, seed = self.draw(step), self.seed(step)
        if self.pool is not None:
            assert self.engine is not None
            return self.pool.submit(self.engine.run, specs, seed)
        assert isinstance(self.rollouts, RayRollouts)
        return self.rollouts.submit(specs, seed)

    def sync(self, state: Callable[[], dict[str, torch.Tensor]], version: int) -> None:
        """The policy of `version` (its weights from `state()`, read only where a client needs a copy)."""
        if self.engine is not None:
            self.engine.policy.offer(state(), version)  # loaded before the background engine's next call
            self.rollouts.sync(None, version)
            return
        self.rollouts.sync(state() if self.needs_weights else None, version)

    def close(self) -> None:
        """Stop the background thread (the rollouts in flight are dropped: a resumed run starts them again)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        if isinstance(self.rollouts, RayRollouts):
            self.inflight.clear()


def background_engine(cfg: TrainConfig, state: dict[str, torch.Tensor], version: int) -> RolloutEngine:
    """An engine over its own copy of the policy (``llm``, loaded with `state` of `version`): in-process
    rollouts ahead of the learner cannot share the model the learner is updating."""
    client = make_client(dataclasses.replace(cfg.llm, dtype=DType.float32))
    engine = RolloutEngine(client, cfg.rollout)
    engine.policy.load_now(state, version)
    return engine


def behaviour_tensors(trajs: list[Trajectory], shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L-1) over the batch's target positions (`rl/batch.py`): the sampler's log-prob of each model token
    (NaN where the backend gave none) and the policy version that sampled it (-1 off the model's tokens)."""
    logps = torch.full(shape, float("nan"))
    versions = torch.full(shape, -1, dtype=torch.long)
    for row, traj in enumerate(trajs):
        seq = traj.to_sequence()
        k = len(seq.input_ids)
        lp = [float("nan") if v is None else v for v in seq.sampler_logprobs[1:]]
        logps[row, : k - 1] = torch.tensor(lp, dtype=torch.float32)
        versions[row, : k - 1] = torch.tensor(seq.versions[1:], dtype=torch.long)
    return logps, versions


def behaviour_data(
    trajs: list[Trajectory], batch: TrainBatch, cfg: TrainConfig, step: int, old_logps: torch.Tensor | None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """A step's sampler log-probs for ``loss.behaviour_correction`` (None when it is off; 0 off the model's
    tokens) and its `async_metrics` (the learner at version `step`, before its update: `old_logps`)."""
    behaviour, versions = behaviour_tensors(trajs, tuple(batch.loss_mask.shape))
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
