"""The learner's updates: PPO epochs over minibatches, each minibatch's gradient accumulated over micro-batches.

`ppo_update` is the update phase of a trainer step: ``ppo_epochs`` passes over
the batch in shuffled minibatches, one optimizer step per minibatch.

`accumulate_gradients` runs forward + backward over the micro-batches of a
minibatch (`batch.micro_batches`, at most ``micro_batch_tokens`` padded tokens
each) and leaves the summed gradient in the parameters' ``.grad``; the caller
clips and steps the optimizer. Every micro-batch's loss is divided by the
normalizer of the *whole* minibatch (`loss.loss_normalizer`), so the
accumulated gradient equals the gradient of the unsplit minibatch.

A distributed learner calls the same function on each rank's share of the
rows, with ``normalizer`` = the all-reduced (summed) normalizer of all ranks'
rows, multiplied by the world size when the gradients are averaged across ranks
(DDP, FSDP): the averaged gradient then equals the single-process one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from palaestra.shared.rl.batch import TrainBatch, micro_batches
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rl.loss import LossConfig, loss_normalizer, policy_loss, token_logprobs_and_entropy

TOKEN_MEANS = ("clip_fraction", "kl", "ratio_mean", "entropy")


def micro_batch_loss(
    model,
    rows: TrainBatch,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    ref_logps: torch.Tensor | None,
    entropies: torch.Tensor | None,
    cfg: LossConfig,
    temperature: float,
    normalizer: float,
    with_entropy: bool = False,
    shared_prompt: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch (its share of the minibatch's loss) with its graph, and its metrics.

    The (rows, T) tensors are on the model's device, trimmed to ``rows``' width. ``old_logps`` None:
    on-policy, the old log-probs are the current ones detached (ratio 1, the same gradient).
    ``with_entropy``: the entropies (for the metrics) come from this forward, without gradient.
    ``shared_prompt``: rows with the same prompt run it once (`loss.token_logprobs_and_entropy`).
    """
    device = next(model.parameters()).device
    logps, ent = token_logprobs_and_entropy(
        model,
        rows.input_ids.to(device),
        rows.attention_mask.to(device),
        temperature,
        with_entropy=with_entropy,
        positions=rows.loss_mask.to(device) > 0,  # the output head runs on the model's tokens only
        shared_prompt=shared_prompt,
    )
    return policy_loss(
        logps,
        logps.detach() if old_logps is None else old_logps,
        advantages,
        rows.loss_mask.to(device),
        cfg,
        ref_logps=ref_logps,
        entropies=ent if with_entropy else entropies,
        normalizer=normalizer,
    )


def accumulate_gradients(
    model,
    batch: TrainBatch,
    idx: torch.Tensor,
    advantages: torch.Tensor,
    cfg: LossConfig,
    temperature: float,
    micro_batch_tokens: int = 0,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    normalizer: float | None = None,
    shared_prompt: bool = False,
) -> dict[str, float]:
    """Backward over the rows `idx` of `batch` in micro-batches; the gradients add up in ``.grad``.

    Full-batch (N, L-1) tensors: `advantages`, `old_logps` (None: on-policy), `ref_logps` (when
    ``cfg.kl_coef``), `entropies` (metrics only; None: computed in the forward). `normalizer`: see the
    module docstring (None: these rows are the whole minibatch). Returns the minibatch's loss (the sum of
    the parts) and token means of clip fraction, kl, ratio and entropy, plus ``tokens`` (the rows' count).
    A non-finite loss is returned as such, before its backward: the caller stops.
    """
    if normalizer is None:
        normalizer = loss_normalizer(batch.loss_mask[idx], cfg)
    device = next(model.parameters()).device
    sums = dict.fromkeys(TOKEN_MEANS, 0.0)
    loss_total, tokens_total = 0.0, 0.0
    for part in micro_batches(batch, idx, micro_batch_tokens):
        rows = batch.rows(part)
        old, adv, ref, ent = (_cut(x, part, rows, device) for x in (old_logps, advantages, ref_logps, entropies))
        assert adv is not None  # advantages always come with the batch
        loss, m = micro_batch_loss(
            model,
            rows,
            old,
            adv,
            ref,
            ent,
            cfg,
            temperature,
            normalizer,
            with_entropy=entropies is None,
            shared_prompt=shared_prompt,
        )
        if not torch.isfinite(loss):
            return {"loss": float(loss.item()), "tokens": tokens_total}
        loss.backward()
        tokens = float(rows.loss_mask.sum())
        loss_total += float(m.pop("loss"))
        tokens_total += tokens
        for k in TOKEN_MEANS:
            sums[k] += m.get(k, 0.0) * tokens
    means = {k: v / max(tokens_total, 1.0) for k, v in sums.items()}
    return {"loss": loss_total, **means, "tokens": tokens_total}


def _cut(x: torch.Tensor | None, part: torch.Tensor, rows: TrainBatch, device) -> torch.Tensor | None:
    return None if x is None else x[part, : rows.loss_mask.shape[1]].to(device)


class NonFiniteLoss(ArithmeticError):
    """A minibatch's loss is NaN or infinite; raised before its optimizer step."""


def ppo_update(
    model,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    advantages: torch.Tensor,
    cfg: TrainConfig,
    step: int,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
) -> dict[str, float]:
    """``cfg.ppo_epochs`` passes over `batch` in shuffled minibatches of ``cfg.minibatch_size`` rows (0: all),
    one optimizer step each (gradients accumulated over micro-batches, clipped to ``optim.max_grad_norm``).
    The shuffle is a function of (seed, step). Returns the metrics averaged over the optimizer steps."""

    def gradients(idx: torch.Tensor) -> dict[str, float]:
        optimizer.zero_grad(set_to_none=True)
        return accumulate_gradients(
            model,
            batch,
            idx,
            advantages,
            cfg.loss,
            cfg.rollout.temperature,
            cfg.learner.micro_batch_tokens,
            old_logps=old_logps,
            ref_logps=ref_logps,
            entropies=entropies,
            shared_prompt=cfg.learner.shared_prompt,
        )

    def optimizer_step(m: dict[str, float]) -> None:
        if cfg.optim.max_grad_norm:
            params = [p for p in model.parameters() if p.requires_grad]
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm))
        optimizer.step()

    return over_minibatches(cfg, step, len(batch), gradients, optimizer_step)


def over_minibatches(
    cfg: TrainConfig,
    step: int,
    rows: int,
    update: Callable[[torch.Tensor], dict[str, float]],
    apply: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """The PPO schedule shared by the in-process and the sharded learner: ``cfg.ppo_epochs`` passes over
    ``rows`` rows in shuffled minibatches (the shuffle a function of seed and step). ``update(idx)`` returns a
    minibatch's metrics; a non-finite loss raises `NonFiniteLoss` before ``apply(metrics)`` (the optimizer
    step). Returns the metrics averaged over the minibatches."""
    mb = cfg.minibatch_size or rows
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + step)
    sums: dict[str, float] = {}
    count = 0
    for epoch in range(cfg.ppo_epochs):
        order = torch.randperm(rows, generator=gen) if mb < rows else torch.arange(rows)
        for start in range(0, rows, mb):
            m = update(order[start : start + mb])
            if not math.isfinite(m["loss"]):
                raise NonFiniteLoss(
                    f"non-finite loss ({m['loss']}) at step {step + 1}, epoch {epoch}, minibatch {start // mb}"
                )
            m.pop("tokens")
            if apply is not None:
                apply(m)
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    return {k: v / count for k, v in sums.items()}
