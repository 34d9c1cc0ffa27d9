"""The decoder's hidden states with each distinct prompt run once for all the rows that share it.

The G samples of a GRPO group share one prompt. `shared_prompt_hidden` runs the
decoder over each distinct prompt once (with gradients when they are enabled),
gives every row its prompt's keys and values (an ``index_select``, so the
gradients of all the rows flow back into the one prompt forward), and runs only
the rows' own tokens on top of them. Per row, the prompt is everything before
its first scored target position (``positions``, i.e. before the first token the
model generated); rows share when their prompts are equal token for token (and
padding for padding) within the rows given, e.g. one micro-batch.

It is the same computation as one forward over the whole rows: every token keeps
its column as position id (what the plain forward uses), and sees the same
tokens through the attention mask (the prompt's, then the row's own). Only the
floating-point summation order differs (other matrix shapes). With
gradient checkpointing, the layers are let keep the cache (transformers drops it
otherwise), which is sound here because neither cache ever grows: the prompt's
records the states it is given, overwriting them when the backward replays a
layer, and the rows' returns the prompt's states followed by the given ones
without storing them.

`unsupported` says why a model cannot go this way (its decoder takes no cache or
position ids, it has sliding-window or other non-full attention layers, whether
named in ``layer_types`` or, as in the Mistral family, only by a ``sliding_window``
that applies to every layer, or its layers would drop the cache under gradient
checkpointing); the caller then runs the plain forward. Sliding windows cannot
share: a row's own tokens sit after its prompt padded to the longest prompt of
the micro-batch, and the window is measured in cache columns, so a row with a
shorter prompt would see the wrong keys (0.05 off in log-prob on a 4-token
window).
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer


class _PromptLayer(DynamicLayer):
    """One layer's prompt states, recorded by the prompt forward; `update` never accumulates."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states  # a checkpoint's replay records the same values again
        return key_states, value_states


class _RowLayer(DynamicLayer):
    """One layer's prompt states expanded to the rows; `update` prepends them to the rows' own, storing nothing."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values

    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def unsupported(model) -> str | None:
    """Why `model` (an HF causal LM, peft unwrapped) cannot share prompts; None when it can."""
    decoder = model.get_decoder()
    params = inspect.signature(decoder.forward).parameters
    if not {"past_key_values", "position_ids", "attention_mask"} <= set(params):
        return f"{type(decoder).__name__}.forward takes no past_key_values / position_ids / attention_mask"
    config = model.config.get_text_config(decoder=True)
    layer_types = getattr(config, "layer_types", None)
    if not layer_types and getattr(config, "sliding_window", None) is not None:
        # the Mistral family: every layer slides, and the config says so only through `sliding_window`
        return f"its config sets sliding_window={config.sliding_window} for every layer (no layer_types)"
    kinds = set(layer_types or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"its layers are {sorted(kinds)} (only full attention layers share a prompt cache)"
    layers = getattr(decoder, "layers", None)
    if getattr(model, "is_gradient_checkpointing", False) and (
        layers is None or not all(hasattr(layer, "_can_checkpoint_with_cache") for layer in layers)
    ):
        return "its layers drop a cache under gradient checkpointing"
    return None


def shared_prompt_hidden(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor | None:
    """The decoder's last hidden states at the target positions ``positions`` (B, L-1) bool, flattened in
    ``positions.nonzero()`` order (state at column j scores token j+1), computed with each distinct prompt run
    once; None when no two rows share a prompt or a scored row has none (the caller runs the plain forward)."""
    batch, length = input_ids.shape
    scored = positions.any(-1)
    start = torch.where(scored, positions.long().argmax(-1), 0)  # the first scored target position
    ids, mask, starts = input_ids.tolist(), attention_mask.tolist(), start.tolist()
    rows = [i for i in range(batch) if scored[i]]
    if not rows or min(starts[i] for i in rows) < 1:
        return None
    groups: dict[tuple, int] = {}
    group_of = [groups.setdefault((tuple(ids[i][: starts[i]]), tuple(mask[i][: starts[i]])), len(groups)) for i in rows]
    if len(groups) == len(rows):
        return None
    device = input_ids.device
    rows_t = torch.tensor(rows, device=device)
    first: dict[int, int] = {}
    for i, g in zip(rows, group_of):
        first.setdefault(g, i)
    reps = torch.tensor([first[g] for g in range(len(groups))], device=device)
    group_t = torch.tensor(group_of, device=device)
    row_start = start[rows_t]

    # the distinct prompts, right-padded to the longest (columns at or past a prompt's end are masked)
    width = int(start[reps].max())
    cols = torch.arange(width, device=device)
    prompt_mask = attention_mask[reps, :width] * (cols < start[reps, None])
    prompt_pos = cols.expand(len(reps), -1)

    # the rows' own tokens: columns start .. the row's last attended column
    last = length - 1 - attention_mask[rows_t].flip(-1).long().argmax(-1)
    span = int((last - row_start).max()) + 1
    own_cols = row_start[:, None] + torch.arange(span, device=device)
    inside = own_cols <= last[:, None]
    own_cols = own_cols.clamp(max=length - 1)
    own_ids = input_ids[rows_t].gather(1, own_cols)
    own_mask = attention_mask[rows_t].gather(1, own_cols) * inside

    decoder = model.get_decoder()
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    prompt_cache = Cache(layers=[_PromptLayer() for _ in range(layers)])
    with _layers_keep_cache(model):
        decoder(
            input_ids=input_ids[reps, :width],
            attention_mask=prompt_mask,
            position_ids=prompt_pos,
            past_key_values=prompt_cache,
            use_cache=True,
        )
        row_cache = Cache(
            layers=[
                _RowLayer(layer.keys.index_select(0, group_t), layer.values.index_select(0, group_t))
                for layer in prompt_cache.layers
            ]
        )
        hidden = decoder(
            input_ids=own_ids,
            attention_mask=torch.cat([prompt_mask.index_select(0, group_t), own_mask], dim=1),
            position_ids=own_cols,
            past_key_values=row_cache,
            use_cache=True,
        ).last_hidden_state
    # target (i, j) is the state at column j of row i: own index j - start[i] of its place among the scored rows
    place = torch.full((batch,), -1, dtype=torch.long, device=device)
    place[rows_t] = torch.arange(len(rows), device=device)
    at = positions.nonzero()
    flat = place[at[:, 0]] * span + at[:, 1] - start[at[:, 0]]
    return hidden.reshape(len(rows) * span, -1).index_select(0, flat)


class _layers_keep_cache:
    """While active, the decoder layers keep the cache under gradient checkpointing (see the module docstring)."""

    def __init__(self, model):
        layers = getattr(model.get_decoder(), "layers", None)
        on = getattr(model, "is_gradient_checkpointing", False) and layers is not None
        self.layers = list(layers) if on else []

    def __enter__(self):
        self.before = [layer.__dict__.get("_can_checkpoint_with_cache") for layer in self.layers]
        for layer in self.layers:
            layer._can_checkpoint_with_cache = True

    def __exit__(self, *exc):
        for layer, before in zip(self.layers, self.before):
            if before is None:
                del layer._can_checkpoint_with_cache  # back to the class's own value
            else:
                layer._can_checkpoint_with_cache = before
