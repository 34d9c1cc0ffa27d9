"""A lean batched decode loop over a transformers causal LM and its KV cache (the transformers backend's default).

It computes what ``model.generate`` computes for sampling and greedy decoding, without the logits-processor and
stopping-criteria machinery around it:

- one prefill over the left-padded prompts, then one forward per new token with the model's own cache
  (the cache the model builds itself, so sliding-window and hybrid models keep theirs); position ids are HF's
  (``cumsum(mask) - 1``); every forward sees the full attention mask, as in ``generate``;
- identical prompts in a batch (``n`` samples of one prompt) are prefilled once and their cache rows copied:
  the same keys and values, computed once (vLLM shares a prompt's prefix among its samples the same way);
- a row ends on an end-of-turn token or when ``stop_rows`` flags it; ended rows get ``pad_id`` from then on, as in
  ``generate``, and leave the batch (their cache rows are dropped), so later steps run on the live rows only;
- sampling applies HF's rule: temperature, then top-k (ties at the k-th value kept), then top-p (sorted ascending,
  tokens whose cumulative probability is <= 1 - top_p removed, the most likely always kept), then one draw from the
  softmax. The draw inverts the CDF with one uniform number per row (the cumulative sum taken in float64):
  the same distribution as ``torch.multinomial``, at a fraction of its CPU cost, but not its random stream;
  greedy is the argmax of the raw logits, exactly ``generate``'s tokens;
- the log-probability of each chosen token is taken from the raw logits (before temperature and filtering),
  with the k most likely tokens when asked; with ``processed_logprobs`` from the distribution it was drawn from
  (the tempered, filtered logits' log-softmax: removed tokens get -inf), as vLLM's ``processed_logprobs``;
- interruptible: with ``at_boundary`` (``fn() -> version``: the version of the weights the model holds, after
  loading any newer ones offered) the loop asks at every token boundary; when the version moved, the in-flight
  rows continue from the tokens they have, their ids as they are (no re-tokenization): one prefill over each
  live row's prompt and generated tokens with the new weights rebuilds the cache (keys and values of the old
  weights would mix two policies in one token's context), and every token is tagged with the version that
  sampled it (``Decoded.versions``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

AtBoundary = Callable[[], int]
"""``fn() -> version``: called before the prefill and at every token boundary; the version of the weights the
model holds then (it may load newer ones first: the loop rebuilds its cache when the version moves)."""
StopRows = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | None"]
"""``fn(rows, tokens) -> flags``: after each step, the live rows' batch indices and their generated tokens so far
``[live, steps]``; returns a bool tensor over the live rows that ends the flagged ones (or None)."""


@dataclass
class Decoded:
    tokens: torch.Tensor
    """[batch, steps] generated ids; ``pad_id`` after a row's end."""
    logprobs: torch.Tensor
    """[batch, steps] log p(token) under the raw logits, or the processed ones (0 after a row's end)."""
    top_ids: torch.Tensor | None
    """[batch, steps, k] the k most likely ids at each step (when asked)."""
    top_logprobs: torch.Tensor | None
    """[batch, steps, k] their log-probabilities (raw or processed, as ``logprobs``)."""
    versions: torch.Tensor | None = None
    """[batch, steps] the version of the weights that sampled each token (with ``at_boundary``; -1 after a
    row's end)."""


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """HF's sampling warpers in HF's order: temperature, top-k, top-p; removed tokens get -inf."""
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1)
        remove = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        remove[..., -1] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def sample(logits: torch.Tensor) -> torch.Tensor:
    """One token per row from ``softmax(logits)``: the first index whose cumulative probability reaches a uniform
    draw in (0, total]. A token of probability 0 is never drawn (its cumulative sum equals its predecessor's)."""
    cdf = logits.softmax(dim=-1).to(torch.float64).cumsum(dim=-1)
    draw = (1 - torch.rand((cdf.shape[0], 1), dtype=torch.float64, device=cdf.device)) * cdf[:, -1:]
    return torch.searchsorted(cdf, draw).squeeze(1).clamp_(max=cdf.shape[-1] - 1)


def _accepts(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


@torch.inference_mode()
def decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    top_logprobs: int = 0,
    stop_rows: StopRows | None = None,
    processed_logprobs: bool = False,
    at_boundary: AtBoundary | None = None,
) -> Decoded:
    """Generate up to `max_new_tokens` for each left-padded row of `input_ids` (temperature 0: greedy).
    `processed_logprobs`: log-probs of the distribution sampled from, not of the raw logits (greedy: raw);
    `at_boundary`: weights that may change between tokens (module docstring)."""
    current = at_boundary() if at_boundary is not None else 0
    device = input_ids.device
    batch, width = input_ids.shape
    # identical rows share one prefill: row r copies the cache of prefilled row `source[r]`
    unique: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    rows: list[int] = []
    source = []
    for r, key in enumerate(zip(map(tuple, input_ids.tolist()), map(tuple, attention_mask.tolist()))):
        if key not in unique:
            unique[key] = len(rows)
            rows.append(r)
        source.append(unique[key])
    firsts = torch.tensor(rows, device=device)
    mask = torch.zeros((batch, width + max_new_tokens), dtype=attention_mask.dtype, device=device)
    mask[:, :width] = attention_mask
    mask[:, width:] = 1
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill_(attention_mask == 0, 0)
    extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    out = model(
        input_ids=input_ids[firsts],
        attention_mask=attention_mask[firsts],
        position_ids=positions[firsts],
        use_cache=True,
        **extra,
    )
    cache = out.past_key_values
    logits = out.logits[:, -1, :].float()
    if len(unique) < batch:
        expand = torch.tensor(source, device=device)
        cache.reorder_cache(expand)
        logits = logits[expand]

    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    k = min(top_logprobs, logits.shape[-1])
    top_ids = torch.zeros((batch, max_new_tokens, k), dtype=torch.long, device=device) if k else None
    top_lp = torch.zeros((batch, max_new_tokens, k), dtype=torch.float32, device=device) if k else None
    versions = torch.full((batch, max_new_tokens), -1, dtype=torch.long, device=device) if at_boundary else None
    eos = torch.tensor(eos_ids, device=device)
    live = torch.arange(batch, device=device)  # batch indices of the rows still generating
    position = positions[:, -1:]
    steps = 0
    for step in range(max_new_tokens):
        if temperature > 0:
            processed = filter_logits(logits, temperature, top_k, top_p)
            chosen = sample(processed)
            if processed_logprobs:
                logits = processed  # what is scored below: the distribution drawn from
        else:
            chosen = logits.argmax(dim=-1)
        lse = torch.logsumexp(logits, dim=-1)
        tokens[live, step] = chosen
        if versions is not None:
            versions[live, step] = current
        logprobs[live, step] = logits.gather(1, chosen[:, None]).squeeze(1) - lse
        if top_ids is not None and top_lp is not None:
            values, ids = torch.topk(logits, k, dim=-1)
            top_ids[live, step], top_lp[live, step] = ids, values - lse[:, None]
        steps = step + 1
        ended = torch.isin(chosen, eos)
        if stop_rows is not None:
            flags = stop_rows(live, tokens[live, :steps])
            if flags is not None:
                ended |= flags.to(device)
        if steps == max_new_tokens or bool(ended.all()):
            break
        if bool(ended.any()):  # drop ended rows from the batch and from the cache
            keep = (~ended).nonzero().squeeze(1)
            cache.reorder_cache(keep)
            live, chosen, position = live[keep], chosen[keep], position[keep]
        position = position + 1
        if at_boundary is not None and (version := at_boundary()) != current:
            current = version  # new weights: the live rows' cache again, from their prompts and tokens so far
            cache, logits = _prefill(
                model, torch.cat([input_ids[live], tokens[live, :steps]], 1), mask[live, : width + steps], extra
            )
            continue
        out = model(
            input_ids=chosen[:, None],
            attention_mask=mask[live, : width + steps],
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1, :].float()
    return Decoded(
        tokens[:, :steps],
        logprobs[:, :steps],
        top_ids[:, :steps] if top_ids is not None else None,
        top_lp[:, :steps] if top_lp is not None else None,
        versions[:, :steps] if versions is not None else None,
    )


def _prefill(model, ids: torch.Tensor, mask: torch.Tensor, extra: dict) -> tuple[Any, torch.Tensor]:
    """One forward over left-padded `ids`: the model's cache of them and the logits after each row's last token."""
    positions = (mask.long().cumsum(-1) - 1).masked_fill_(mask == 0, 0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
    return out.past_key_values, out.logits[:, -1, :].float()
