"""The learner's model: float32 master weights, compute dtype, activation checkpointing, LoRA, think markers.

`load_policy` builds the learner's LLM client from ``cfg.llm`` with float32
weights (the master copy the optimizer updates), resolves the compute dtype
(``learner.compute_dtype``: bfloat16 autocast on GPU, float32 on CPU), turns on
the model's own activation checkpointing (``learner.gradient_checkpointing``,
non-reentrant) and wraps it with LoRA adapters (``lora.enabled``).
`policy_state` is the policy's weights under the plain model's names for the
rollout workers; `think_token_ids` finds the ``<think>`` markers.

The frozen KL reference (`reference_copy`) is kept in the compute dtype: bfloat16 with bf16 compute (on a GPU),
float32 otherwise. Its forward runs under the same autocast as the policy's, whose matmuls round the float32
weights to bf16 anyway, so a bf16 copy changes its log-probs only where autocast keeps float32 (norms,
embeddings): within bf16 rounding. verl and TRL hold their references in bf16 too. It is made parameter by
parameter (no second float32 copy at any time): the trainer's peak is one float32 model plus the bf16 copy.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch

from palaestra.shared.config import ConfigError
from palaestra.shared.llm.base import DType, LLMClient, make_client
from palaestra.shared.llm.hf_backend import resolve_device
from palaestra.shared.llm.lora import with_lora
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.config import TrainConfig, learner_dtypes


def check_learner(cfg: TrainConfig) -> None:
    """Fail on a learner setting that cannot hold (dtypes, the micro-batch budget) before any model is loaded."""
    if cfg.learner.micro_batch_tokens < 0:
        raise ConfigError(
            f"learner.micro_batch_tokens must be >= 0 (0: no split), got {cfg.learner.micro_batch_tokens}"
        )
    learner_dtypes(cfg.learner, cfg.llm, resolve_device(cfg.llm.device).type)


def load_policy(cfg: TrainConfig, adapter: str = "default") -> tuple[LLMClient, torch.nn.Module, torch.dtype]:
    """The learner's client, its model (LoRA-wrapped when enabled, its adapter named `adapter`) and the compute
    dtype."""
    check_learner(cfg)
    client = make_client(dataclasses.replace(cfg.llm, dtype=DType.float32))
    model = client.model
    compute_dtype = getattr(torch, learner_dtypes(cfg.learner, cfg.llm, next(model.parameters()).device.type))
    if cfg.learner.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora.enabled:
        model = with_lora(model, cfg.lora, adapter)
    return client, model, compute_dtype


def reference_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype the frozen reference is kept in: the compute dtype when it is narrower than float32."""
    return compute_dtype if compute_dtype in (torch.bfloat16, torch.float16) else torch.float32


def reference_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of `model` with its parameters in `dtype` (buffers as they are), built without a whole
    float32 copy first: each parameter is cast on its own, then the module tree is copied around the casts."""
    memo: dict[int, object] = {
        id(p): torch.nn.Parameter(p.detach().to(dtype, copy=True), requires_grad=False) for p in model.parameters()
    }
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


def autocast(device: torch.device, compute_dtype: torch.dtype):
    """The forward/backward context of the learner: autocast to `compute_dtype` unless it is float32."""
    if compute_dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=compute_dtype)


def policy_state(model, lora: bool) -> dict[str, torch.Tensor]:
    """The policy's weights under the plain model's names (LoRA merged in) for the rollout workers."""
    return checkpoint.merged_lora_state(model) if lora else model.state_dict()


def think_token_ids(tokenizer):
    """``<think>`` and ``</think>`` as token ids, or as the id sequences they tokenize to (no such tokens, e.g.
    SmolLM2): without them the think span is empty and EGPO's entropy term silently vanishes."""
    ids = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    unk = tokenizer.unk_token_id
    if not any(i is None or i == unk for i in ids):
        return ids[0], ids[1]
    seqs = [tuple(tokenizer.encode(m, add_special_tokens=False)) for m in ("<think>", "</think>")]
    return (seqs[0], seqs[1]) if all(seqs) else None
