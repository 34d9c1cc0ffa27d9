"""Token-level PPO-clip policy loss with the reductions of GRPO, DAPO and Dr. GRPO.

Per response token, with ratio ρ = exp(logπ - logπ_old) and advantage A::

    ℓ = -min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)
    dual clip (c > 1, Ye et al. 2020), for A < 0 only:  ℓ = min(ℓ, -c·A)
    k3 KL to a frozen reference (Schulman):  ℓ += β·(exp(ref - logπ) - (ref - logπ) - 1)
    (clamped to [-kl_clamp, kl_clamp] when set, as MARS's ROLL ``compute_approx_kl`` with 10)

Reductions over the masked tokens (as TRL's ``GRPOTrainer``):

- ``grpo``: mean over each sequence's tokens, then mean over sequences;
- ``dapo``: mean over all tokens of the batch;
- ``dr_grpo``: sum over all tokens / (batch size · a constant max length);
- ``seq-mean-token-sum``: MARS's default (ROLL's ``agg_loss``). Despite its name, ROLL takes each
  sequence's token *mean* (``masked_mean(dim=-1)``) and averages over the sequences that have tokens:
  ``grpo`` except that a sequence without response tokens does not count.

Each reduction is a sum divided by a normalizer of the whole minibatch
(`loss_normalizer`: sequences for grpo, tokens for dapo, sequences x max length
for dr_grpo). A minibatch split into micro-batches (gradient accumulation) or
across ranks passes the minibatch's normalizer to every part, so the parts'
losses and gradients add up to the unsplit ones exactly.

Behaviour correction (``loss.behaviour_correction``; rl/async_rollouts.py keeps rollouts of older
policy versions in flight): with the behaviour policy's log-probs μ (the sampler's, per token) and the
learner's own before the update (π_old, the proximal policy of decoupled PPO), w = π_old / μ, detached:

- ``tis`` (truncated importance sampling, verl/AReaL ``token_truncate``): ℓ ← min(w, C) · ℓ;
- ``mis`` (masked importance sampling, ``token_mask``): ℓ ← 0 where w > C or w < 1/C (the token masked;
  it still counts in the reduction's normalizer, as verl's rejection mask leaves the loss's denominator);
- ``off``: no correction (the loss is the plain PPO loss against π_old).

`policy_loss` returns the loss and detached metrics (entropy, clip fraction, kl).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from palaestra.shared.config import value_check

# torch is imported in the functions that compute: `LossConfig` and its checks load without it (`palaestra show`)
if TYPE_CHECKING:
    import torch


class BehaviourCorrection(StrEnum):
    """Importance-sampling correction of the behaviour-vs-learner gap per token (module docstring)."""

    off = "off"
    tis = "tis"
    mis = "mis"


# made by name so that every member's name is its value: the config, its errors and `palaestra show` all
# spell ROLL's ``seq-mean-token-sum`` one way (a class body would need a second, Python-safe name)
Reduction = StrEnum(
    "Reduction",
    [("grpo", "grpo"), ("dapo", "dapo"), ("dr_grpo", "dr_grpo"), ("seq-mean-token-sum", "seq-mean-token-sum")],
    module=__name__,
)
Reduction.__doc__ = "How token losses become one loss (see the module docstring)."
SEQ_MEAN_TOKEN_SUM = Reduction("seq-mean-token-sum")


@dataclass
class LossConfig:
    """The PPO loss."""

    epsilon: float = 0.2
    """Lower clip range: ratio >= 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip range: ratio <= 1 + epsilon_high (None: epsilon; DAPO's clip-higher uses e.g. 0.28)."""
    dual_clip: float | None = field(default=None, metadata=value_check("palaestra.shared.rl.loss:check_dual_clip"))
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (None: off; MARS: 1 + 2ε = 1.4)."""
    kl_coef: float = 0.0
    """β of the k3 KL to the frozen reference model (0: no reference model is kept)."""
    reduction: Reduction = Reduction.grpo
    """grpo | dapo | dr_grpo | seq-mean-token-sum (MARS)."""
    max_len: int = 0
    """dr_grpo's constant length (0: the rollout's max tokens per turn)."""
    kl_clamp: float | None = field(default=None, metadata=value_check("palaestra.shared.config:check_positive"))
    """Clamp the k3 KL term per token to [-kl_clamp, kl_clamp] (None: off; MARS/ROLL ``compute_approx_kl``: 10)."""
    logprob_temperature: float | None = field(
        default=None, metadata=value_check("palaestra.shared.config:check_positive")
    )
    """The temperature the learner divides the logits by for old, new and reference log-probs (None: the
    rollout's sampling temperature; MARS: 1.0, its log-probs are of the untempered policy)."""
    behaviour_correction: BehaviourCorrection = BehaviourCorrection.off
    """off | tis (weight min(π_old/μ, C)) | mis (tokens with π_old/μ outside [1/C, C] masked): the
    correction for tokens sampled by an older (or another engine's) policy μ (module docstring)."""
    behaviour_threshold: float = field(
        default=2.0, metadata=value_check("palaestra.shared.rl.loss:check_behaviour_threshold")
    )
    """C of the behaviour correction (> 1; verl's default 2.0)."""


def check_dual_clip(value: float, owner: LossConfig) -> str | None:
    """The dual-clip constant bounds the loss of negative-advantage tokens only when c > 1."""
    return None if value > 1 else f"the dual-clip constant must be > 1 (None: off; MARS 1.4), got {value}"


def check_behaviour_threshold(value: float, owner: LossConfig) -> str | None:
    """A truncation or masking bound of an importance weight is above 1 (1 would discard all off-policy signal)."""
    return None if value > 1 else f"must be > 1 (verl's default 2.0), got {value}"


def behaviour_weights(
    old_logps: torch.Tensor, behaviour_logps: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the correction's factor on the loss (detached) and where it acted (truncated or masked)."""
    import torch

    ratio = torch.exp(old_logps.detach() - behaviour_logps)
    c = cfg.behaviour_threshold
    if cfg.behaviour_correction == BehaviourCorrection.tis:
        return ratio.clamp(max=c), ratio > c
    if cfg.behaviour_correction == BehaviourCorrection.mis:
        outside = (ratio > c) | (ratio < 1.0 / c)
        return (~outside).to(ratio.dtype), outside
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    ref_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    normalizer: float | None = None,
    behaviour_logps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss over (B, T) tensors; `advantages` is (B, T) or (B,). `behaviour_logps`: the sampler's
    log-probs, for ``behaviour_correction`` (ignored when it is off).

    `normalizer`: the minibatch's `loss_normalizer` when these rows are one part of it
    (None: these rows are the whole minibatch). The metrics are token means over these rows.
    """
    import torch

    _check_reduction(cfg)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    mask = mask.to(logps.dtype)
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high

    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + eps_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if cfg.dual_clip is not None:
        if cfg.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {cfg.dual_clip}")
        per_token = torch.where(advantages < 0, torch.min(per_token, -cfg.dual_clip * advantages), per_token)
    if cfg.behaviour_correction != BehaviourCorrection.off and behaviour_logps is not None:
        per_token = per_token * behaviour_weights(old_logps, behaviour_logps, cfg)[0]

    kl = None
    if cfg.kl_coef != 0.0:
        if ref_logps is None:
            raise ValueError("kl_coef != 0 needs reference logprobs")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        if cfg.kl_clamp is not None:
            kl = kl.clamp(-cfg.kl_clamp, cfg.kl_clamp)
        per_token = per_token + cfg.kl_coef * kl

    loss = reduce_tokens(per_token, mask, cfg, normalizer)

    with torch.no_grad():
        tokens = mask.sum().clamp(min=1.0)
        low = (ratio < 1 - cfg.epsilon) & (advantages < 0)
        high = (ratio > 1 + eps_high) & (advantages > 0)
        metrics = {
            "loss": loss.item(),
            "clip_fraction": (((low | high).to(mask.dtype) * mask).sum() / tokens).item(),
            "kl": ((kl * mask).sum() / tokens).item() if kl is not None else 0.0,
            "ratio_mean": ((ratio * mask).sum() / tokens).item(),
        }
        if entropies is not None:
            metrics["entropy"] = ((entropies * mask).sum() / tokens).item()
    return loss, metrics


def loss_normalizer(mask: torch.Tensor, cfg: LossConfig) -> float:
    """What `reduce_tokens` divides by for the rows of `mask` (B, T): sequences (grpo), tokens (dapo) or
    sequences x ``max_len`` (dr_grpo). Counts add up: a distributed caller all-reduces (sums) each rank's."""
    _check_reduction(cfg)
    if cfg.reduction == Reduction.grpo:
        return float(mask.shape[0])
    if cfg.reduction == SEQ_MEAN_TOKEN_SUM:
        return float((mask.sum(-1) > 0).sum())
    if cfg.reduction == Reduction.dapo:
        return float(mask.sum())
    return float(mask.shape[0] * cfg.max_len)


def reduce_tokens(
    per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig, normalizer: float | None = None
) -> torch.Tensor:
    """Sum of per-sequence token means (grpo) or of all tokens (dapo, dr_grpo), divided by `normalizer`
    (default: `loss_normalizer` of these rows, i.e. these rows are the whole minibatch)."""
    if normalizer is None:
        normalizer = loss_normalizer(mask, cfg)
    if cfg.reduction in (Reduction.grpo, SEQ_MEAN_TOKEN_SUM):
        total = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum()
    else:
        total = (per_token * mask).sum()
    return total / max(normalizer, 1.0)


def _check_reduction(cfg: LossConfig) -> None:
    # a LossConfig built in code may miss the max_len that TrainConfig.__post_init__ fills in
    if cfg.reduction == Reduction.dr_grpo and cfg.max_len <= 0:
        raise ValueError("dr_grpo needs loss.max_len > 0 (the constant normalizer)")
