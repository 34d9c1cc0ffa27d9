"""The learner's inner loop, one copy for both learners: scoring and the gradient of a minibatch over micro-batches.

`StepData` holds one RL step's tensors (the batch, advantages, old and
reference log-probs, entropies) and cuts a micro-batch's share of them.

`score_rows` runs log-prob (and entropy) forwards over micro-batches of at most
``micro_batch_tokens`` padded tokens (`batch.micro_batches`) without gradients.
`minibatch_step` is one optimizer step over the rows of a minibatch: forward +
backward per micro-batch, the gradients adding up in ``.grad``, then clipping
to ``optim.max_grad_norm`` and the optimizer step. Every micro-batch's loss is
divided by the normalizer of the *whole* minibatch (`loss.loss_normalizer`), so
the accumulated gradient equals the gradient of the unsplit minibatch.
`ppo_update` is the update phase of a trainer step: ``ppo_epochs`` passes over
the batch in shuffled minibatches (`over_minibatches`), one `minibatch_step`
each, at the learning rate of that optimizer step (rl/optim.py).

The in-process learner (rl/learner.py) calls these with the single-process
`Collectives`; each rank of the sharded learner (rl/distributed_rank.py) calls
them on its share of the rows with its own, whose hooks all-reduce: the token
normalizer is summed over the ranks and multiplied by the world size (DDP and
FSDP average the gradients: the averaged gradient is then the single-process
one), the micro-batch count is the maximum over the ranks (a rank with fewer
runs `Collectives.idle_pass`, so every rank issues the same collectives), a
non-finite loss on any rank stops all before the backward, and the metrics'
sums are summed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from palaestra.shared.rl.batch import TrainBatch, micro_batches
from palaestra.shared.rl.loss import LossConfig, loss_normalizer, policy_loss

TOKEN_MEANS = ("clip_fraction", "kl", "ratio_mean", "entropy")

Forward = Callable[[TrainBatch, bool], tuple[torch.Tensor, torch.Tensor | None]]
"""``forward(rows, with_entropy) -> (logps, entropies)``: a micro-batch's (rows, T) log-probs on the model's
device (the learner binds its model, device, temperature and autocast)."""


@dataclass
class StepData:
    """One RL step's tensors: (N, L-1) over the batch's target positions, on the CPU."""

    batch: TrainBatch
    advantages: torch.Tensor
    """Per token (`batch.token_advantages`)."""
    old_logps: torch.Tensor | None = None
    """The rollout policy's log-probs (None: on-policy, the update's own detached: ratio 1, the same gradient)."""
    ref_logps: torch.Tensor | None = None
    """The frozen reference's log-probs (when ``loss.kl_coef``)."""
    entropies: torch.Tensor | None = None
    """For the metrics (None: taken from the update's own forward)."""
    behaviour_logps: torch.Tensor | None = None
    """The sampler's log-probs of the model's tokens (for ``loss.behaviour_correction``; None: no correction)."""
    step: int = 0
    """The RL step these tensors belong to (0-based): it seeds the minibatch shuffle and places the rates."""
    steps: int = 1
    """The run's RL steps (the learning-rate schedule's length)."""

    def part(self, idx: torch.Tensor, device: torch.device | str) -> StepData:
        """The rows `idx`, trimmed to their longest row, the tensors on `device` (the batch stays on the CPU)."""
        rows = self.batch.rows(idx)
        width = rows.loss_mask.shape[1]

        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[idx, :width].to(device)

        advantages = cut(self.advantages)
        assert advantages is not None
        parts = (cut(self.old_logps), cut(self.ref_logps), cut(self.entropies), cut(self.behaviour_logps))
        return StepData(rows, advantages, *parts, step=self.step, steps=self.steps)


class Collectives:
    """Where the ranks of a sharded learner agree (a rank's subclass all-reduces); one process agrees with itself."""

    world_size = 1

    def max(self, value: int) -> int:
        return value

    def sum(self, values: list[float]) -> list[float]:
        return values

    def all_finite(self, finite: bool) -> bool:
        return finite

    def idle_pass(self) -> torch.Tensor:
        """A pass that moves nothing but issues a real micro-batch's collectives (a rank with fewer parts)."""
        raise AssertionError("a single process has no idle micro-batches")


LOCAL = Collectives()


@torch.no_grad()
def score_rows(
    forward: Forward,
    batch: TrainBatch,
    idx: torch.Tensor,
    max_tokens: int = 0,
    max_rows: int = 0,
    with_entropy: bool = True,
    collectives: Collectives = LOCAL,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the rows `idx` (model tokens only; 0 elsewhere), one forward per micro-batch
    (`micro_batches` with `max_tokens` / `max_rows`); (N, L-1) float32 CPU tensors, filled at `idx`."""
    parts = micro_batches(batch, idx, max_tokens, max_rows) if len(idx) else []
    logps = torch.zeros(batch.loss_mask.shape)
    ents = torch.zeros(batch.loss_mask.shape) if with_entropy else None
    for k in range(collectives.max(len(parts))):
        if k >= len(parts):
            collectives.idle_pass()
            continue
        lp, ent = forward(batch.rows(parts[k]), with_entropy)
        logps[parts[k], : lp.shape[1]] = lp.float().cpu()
        if ents is not None and ent is not None:
            ents[parts[k], : ent.shape[1]] = ent.float().cpu()
    return logps, ents


def micro_batch_loss(
    forward: Forward, part: StepData, cfg: LossConfig, normalizer: float, device
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's share of the minibatch's loss (with its graph) and its metrics."""
    with_entropy = part.entropies is None
    logps, ent = forward(part.batch, with_entropy)
    return policy_loss(
        logps,
        logps.detach() if part.old_logps is None else part.old_logps,
        part.advantages,
        part.batch.loss_mask.to(device),
        cfg,
        ref_logps=part.ref_logps,
        entropies=ent if with_entropy else part.entropies,
        normalizer=normalizer,
        behaviour_logps=part.behaviour_logps,
    )


def accumulate(
    forward: Forward,
    data: StepData,
    idx: torch.Tensor,
    cfg: LossConfig,
    micro_batch_tokens: int,
    device,
    collectives: Collectives = LOCAL,
) -> dict[str, float]:
    """Backward over the rows `idx` in micro-batches; the gradients add up in ``.grad``.

    Returns this process's sums: ``loss`` (of the parts), ``tokens`` and the token-weighted sums of
    `TOKEN_MEANS`. A non-finite loss (on any rank) returns ``loss`` NaN-or-inf before its backward.
    """
    local = loss_normalizer(data.batch.loss_mask[idx], cfg) if len(idx) else 0.0
    (total,) = collectives.sum([local])
    normalizer = total / collectives.world_size  # gradients are averaged over ranks: each rank's loss x N
    parts = micro_batches(data.batch, idx, micro_batch_tokens) if len(idx) else []
    sums = dict.fromkeys(("loss", "tokens", *TOKEN_MEANS), 0.0)
    for k in range(collectives.max(len(parts))):
        if k < len(parts):
            part = data.part(parts[k], device)
            loss, m = micro_batch_loss(forward, part, cfg, normalizer, device)
            tokens = float(part.batch.loss_mask.sum())
        else:
            loss, m, tokens = collectives.idle_pass(), {}, 0.0
        finite = bool(torch.isfinite(loss))
        if not collectives.all_finite(finite):
            return {"loss": float(loss.item()) if not finite else math.nan, "tokens": sums["tokens"]}
        loss.backward()
        sums["loss"] += float(loss.item())
        sums["tokens"] += tokens
        for name in TOKEN_MEANS:
            sums[name] += m.get(name, 0.0) * tokens
    return sums


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to the global gradient norm (FSDP2: the sharded DTensor norm completed across ranks with
    ``full_tensor``, as verl's ``fsdp2_clip_grad_norm_``; in one process torch's ``clip_grad_norm_``)."""
    from torch.distributed.tensor import DTensor

    params = [p for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()  # sum of the shards' squares across ranks
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def minibatch_step(
    forward: Forward,
    data: StepData,
    idx: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    cfg: LossConfig,
    micro_batch_tokens: int,
    max_grad_norm: float,
    device,
    collectives: Collectives = LOCAL,
) -> dict[str, float]:
    """One optimizer step over the rows `idx` (this rank's share of the minibatch): gradients accumulated over
    micro-batches, clipped to `max_grad_norm` (0: off). Returns the minibatch's loss, ``tokens``, the token
    means of `TOKEN_MEANS` and ``grad_norm`` (when clipping); a non-finite loss returns before any step."""
    optimizer.zero_grad(set_to_none=True)
    sums = accumulate(forward, data, idx, cfg, micro_batch_tokens, device, collectives)
    if not math.isfinite(sums["loss"]):
        return sums
    grad_norm = clip_grad_norm(params, max_grad_norm) if max_grad_norm else None
    optimizer.step()
    keys = list(sums)
    out = token_means(dict(zip(keys, collectives.sum([sums[k] for k in keys]))), collectives.world_size)
    if grad_norm is not None:
        out["grad_norm"] = grad_norm
    return out


def token_means(sums: dict[str, float], world_size: int = 1) -> dict[str, float]:
    """`accumulate`'s sums (all ranks' added up) as the minibatch's loss, ``tokens`` and token means."""
    out = {"loss": sums["loss"] / world_size, "tokens": sums["tokens"]}
    out.update({k: sums[k] / max(sums["tokens"], 1.0) for k in TOKEN_MEANS})
    return out


class NonFiniteLoss(ArithmeticError):
    """A minibatch's loss is NaN or infinite; raised before its optimizer step."""


def over_minibatches(
    ppo_epochs: int, minibatch_size: int, seed: int, step: int, rows: int, update: Callable[[torch.Tensor, int], dict]
) -> dict[str, float]:
    """The PPO schedule: `ppo_epochs` passes over `rows` rows in shuffled minibatches of `minibatch_size` (0:
    all; the shuffle a function of seed and step). ``update(idx, k)`` makes the step's k-th optimizer step and
    returns its metrics; a non-finite loss raises `NonFiniteLoss`. Returns the metrics averaged over the
    optimizer steps (``tokens`` left out)."""
    mb = minibatch_size or rows
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    sums: dict[str, float] = {}
    count = 0
    for epoch in range(ppo_epochs):
        order = torch.randperm(rows, generator=gen) if mb < rows else torch.arange(rows)
        for start in range(0, rows, mb):
            m = update(order[start : start + mb], count)
            if not math.isfinite(m["loss"]):
                raise NonFiniteLoss(
                    f"non-finite loss ({m['loss']}) at step {step + 1}, epoch {epoch}, minibatch {start // mb}"
                )
            m.pop("tokens")
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    return {k: v / count for k, v in sums.items()}
