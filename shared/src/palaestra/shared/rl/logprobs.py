"""Per-token log-probs and entropies of a causal LM, computed a chunk of positions at a time.

`token_logprobs_and_entropy` is the learner's one forward: the decoder once (or once per shared prompt,
rl/shared_prompt.py), then the output head over chunks of the scored positions in float32, so no
(B, L, vocab) logits tensor exists; each chunk is checkpointed when gradients flow. Both learners call it
(rl/learner.py in-process, rl/distributed_rank.py on the ranks).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from palaestra.shared.rl.config import LOGIT_CHUNK_ELEMENTS
from palaestra.shared.rl.shared_prompt import shared_prompt_hidden, unsupported


def token_logprobs_and_entropy(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
    positions: torch.Tensor | None = None,
    shared_prompt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token under `model` (logits / temperature), and the entropy there; shape (B, L-1).

    `positions` (B, L-1) bool: score only these target positions (e.g. the model's own tokens; the output
    head is then not run on prompt or environment tokens, as TRL's ``logits_to_keep``); the others are 0.

    `shared_prompt` (with `positions`): rows with the same prompt (the tokens before their first scored
    position, e.g. a GRPO group's samples) run it through the decoder once (`shared_prompt.shared_prompt_hidden`);
    a model that cannot (`shared_prompt.unsupported`) runs the plain forward, with a warning.

    The decoder's hidden states go through the output head a chunk of positions at a time (about
    `chunk_elements` logits each), in float32, so no (B, L, vocab) logits tensor exists. With gradients
    and more than one chunk, each chunk is checkpointed: its logits are recomputed in the backward
    instead of kept. Entropies are computed without gradient. Models with ``final_logit_softcapping``
    get the cap applied as their own forward does.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: adapters stay active
    head = base.get_output_embeddings()
    batch, width = input_ids.shape[0], input_ids.shape[1] - 1
    targets = input_ids[:, 1:].reshape(-1)
    keep = None if positions is None else positions.reshape(-1).nonzero().squeeze(-1)
    if keep is not None:
        targets = targets.index_select(0, keep)
    hidden = _shared_prompt_hidden(base, input_ids, attention_mask, positions) if shared_prompt else None
    if hidden is None:
        hidden = base.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
        hidden = hidden.reshape(batch * width, hidden.shape[-1])
        if keep is not None:
            hidden = hidden.index_select(0, keep)
    softcap = getattr(base.config, "final_logit_softcapping", None)
    logps, ents = head_logprobs(hidden, targets, head, temperature, softcap, with_entropy, chunk_elements)
    return _unflatten(logps, batch, width, positions), (
        _unflatten(ents, batch, width, positions) if ents is not None else None
    )


def head_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: Any,
    temperature: float = 1.0,
    softcap: float | None = None,
    with_entropy: bool = True,
    chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
    float32_grad_sum: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` (P,) under the output `head` over `hidden` (P, H), a chunk of positions at a time
    (checkpointed when gradients flow); float32 (P,) log-probs and entropies.

    Every chunk adds its share to the head's weight gradient. With a low-precision head (bfloat16 weights, as
    FSDP's mixed precision gathers them, or bfloat16 autocast) autograd would add the hundreds of chunks'
    shares in that precision, each sum rounded to 8 bits of mantissa; ``float32_grad_sum`` (None: exactly
    then) runs each chunk's matmul from a per-chunk cast of one float32 copy of the weight, so the shares add
    up in float32 and are rounded once (the forward values are the same bfloat16 matmul's).
    """
    compute = _compute_dtype(head, hidden.device.type)
    if float32_grad_sum is None:
        float32_grad_sum = compute.itemsize < 4 and torch.is_grad_enabled() and head.weight.requires_grad
    linear = _float32_sum_linear(head, compute) if float32_grad_sum else head
    score = functools.partial(
        _chunk_scores, head=linear, temperature=temperature, softcap=softcap, with_entropy=with_entropy
    )
    step = max(1, chunk_elements // head.out_features)
    checkpointed = torch.is_grad_enabled() and hidden.requires_grad and len(targets) > step
    logps, ents = [], []
    for start in range(0, len(targets), step):
        h, t = hidden[start : start + step], targets[start : start + step]
        lp, ent = checkpoint(score, h, t, use_reentrant=False) if checkpointed else score(h, t)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        logps, ents = [hidden.new_zeros(0, dtype=torch.float32)], [hidden.new_zeros(0, dtype=torch.float32)]
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def _compute_dtype(head: Any, device_type: str) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's when it is on, else the weight's."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return head.weight.dtype


def _float32_sum_linear(head: Any, compute: torch.dtype):
    """``head`` as a function whose weight (and bias) gradients of all calls add up in float32: one float32 copy
    (the float32 parameter itself when it is one), cast to `compute` at each call."""
    weight = head.weight.float()
    bias = head.bias.float() if getattr(head, "bias", None) is not None else None
    device_type = weight.device.type

    def linear(h: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, enabled=False):
            b = None if bias is None else bias.to(compute)
            return torch.nn.functional.linear(h.to(compute), weight.to(compute), b)

    return linear


def _shared_prompt_hidden(base, input_ids, attention_mask, positions) -> torch.Tensor | None:
    """`shared_prompt.shared_prompt_hidden`, or None (the plain forward) when the model cannot share prompts."""
    if positions is None:
        raise ValueError("shared_prompt needs the scored positions (the prompt is what precedes the first)")
    reason = unsupported(base)
    if reason is not None:
        warnings.warn(f"learner.shared_prompt: {type(base).__name__} runs the plain forward: {reason}", stacklevel=3)
        return None
    return shared_prompt_hidden(base, input_ids, attention_mask, positions)


def _unflatten(values: torch.Tensor, batch: int, width: int, positions: torch.Tensor | None) -> torch.Tensor:
    if positions is None:
        return values.reshape(batch, width)
    out = values.new_zeros(batch, width)
    return out.masked_scatter(positions, values)  # differentiable: gradients flow back to `values`


def _chunk_scores(hidden, targets, *, head, temperature, softcap, with_entropy):
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 (float64 stays)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logps = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy
