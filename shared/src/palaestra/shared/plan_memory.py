"""The memory model of `palaestra plan`: what one learner device, the trainer's device and a vLLM
worker's GPU hold for an RL config (plan.py turns it into the report).

The model's architecture comes from its config without downloading weights: the embedded ``tiny`` (its
cached ``config.json``), a local HF directory, the HF cache (``local_files_only``), else
`KNOWN_ARCHITECTURES` (hub ids such as Qwen/Qwen3-4B-Instruct-2507 that are not available offline).

What one learner device holds (P parameters, N = ``learner.world_size``,
sharded parts divided by N under ``fsdp``, whole under ``ddp``):

- weights, gradients, AdamW's two moments: 4 + 4 + 8 = 16 bytes per parameter with
  fp32 master weights (mixed precision, or fp32 throughout on CPU); 2 + 2 + 4 with bf16 weights; the moments
  none with ``learner.optimizer_offload`` (rl/optim_offload.py: in CPU memory);
- under fsdp: the all-gathered compute-dtype copy of the root (embeddings, lm_head) and of
  two decoder layers (the current one and the prefetched next), plus one layer's unsharded
  fp32 gradient before its reduce-scatter; under ddp with bf16 compute: autocast's weight copies;
- under fsdp: the output layer's (the root's: embeddings, lm_head) unsharded gradient, in the compute
  dtype: the first logit chunk's backward creates it and the root's reduce-scatter frees it only once the
  whole backward is done, so it is held through the backward pass (c x root parameters);
- the frozen reference model (``loss.kl_coef`` > 0, no LoRA) in the compute dtype (bf16 on a GPU, float32 on
  CPU: rl/policy.py `reference_dtype`), sharded like the weights: the ranks load it in that dtype
  (rl/distributed_rank.py) and the in-process learner casts its model's parameters one by one (`reference_copy`);
- activations of one micro-batch (T tokens). Per token and decoder layer, what autograd keeps in
  a Qwen/Llama layer (the two RMSNorms' fp32 input and compute-dtype output, kept twice as the
  projections' 2-D inputs; q/k norms; rotated q and k, v, the attention output and its 2-D copy;
  the SwiGLU MLP's gate, up, activation and product): with c the compute dtype's bytes,
  ``(4+2c)·2h + (4+c)(q+k) + c(3q+2k) + 4c·I`` (h hidden, q = heads·head_dim, k = kv_heads·head_dim,
  I intermediate; attention itself is flash/SDPA, linear in T). With gradient checkpointing only each
  layer's input (c·h per token per layer) is kept, plus one layer recomputed during backward;
- the attention mask of a padded micro-batch (T tokens, longest row L): transformers builds one boolean
  (rows, 1, L, L) mask, T x L bytes at most, and SDPA converts it for each attention call into an additive
  mask in the compute dtype that autograd keeps for the backward: c x T x L per layer, so one layer's
  worth with gradient checkpointing (the layer being recomputed), all layers' without (measured on CPU,
  where SDPA's math backend does this; cuDNN's converts too, while the memory-efficient kernel takes the
  boolean mask itself, and then this counts c x T x L per layer too many: erring on the safe side);
- logits: rl/logprobs.py runs the output head a chunk of `LOGIT_CHUNK_ELEMENTS` logits at a time,
  checkpointed, so only one chunk is alive: its compute-dtype and float32 logits, log-softmax,
  the entropy's exp, and in the backward two float32 gradients and one in the compute dtype;
- a flat runtime reserve (CUDA context, allocator fragmentation): `RUNTIME_RESERVE_GB`.

Several policies (``policies``, rl/policies.py) share the learner's process and update one at a time: every
policy's weights, gradients, AdamW moments and reference are held together, the transient parts (activations,
logits, masks) of the largest once (`policies_memory`); LoRA adapters on one base model count the base once.
A policy with ``learner.world_size`` > 1 (the run's or its own) has a sharded learner of its own: its ranks
on devices of their own (the learner device's figure is the largest policy's rank), its GPUs counted apart,
and its float32 copy (with a reference: its compute-dtype copy too while it is made) on the trainer's device.

With ``learner.world_size`` > 1 and ``llm.device`` on a GPU, the trainer's process keeps a
float32 copy of the weights there (rollouts in process, evaluation, checkpoints): one more GPU.
With a reference model it peaks at that copy and the reference in the compute dtype (bf16), made parameter by
parameter (saved for the ranks, then dropped once they start): `trainer_weight_bytes`.

A vLLM worker's GPU: vLLM takes ``gpu_memory_utilization`` of it; its KV cache is that
budget less the bf16 weights (split by tensor parallelism) and `VLLM_OVERHEAD_GB` of
activations; it must hold at least one ``rollout.max_context_tokens`` sequence
(vLLM refuses to start otherwise).

The figures are estimates (they ignore e.g. optimizer step temporaries and the allocator's caching
beyond the reserve); they exist to catch a config that cannot fit by a wide margin.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

GB = 1e9
RUNTIME_RESERVE_GB = 3.0
VLLM_OVERHEAD_GB = 2.0


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer with a SwiGLU MLP (Qwen2/3, Llama, SmolLM2)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qk_norm: bool = False
    context: int = 0
    """``max_position_embeddings``: a vLLM engine's ``max_model_len``, which its KV cache must hold (0: unknown)."""

    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attention + mlp + norms

    def root_params(self) -> int:
        """Embeddings, lm_head (when untied) and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()


KNOWN_ARCHITECTURES: dict[str, ModelArch] = {
    # Qwen3-4B (base and Instruct-2507 share it): config.json of the hub repos; 4.02B parameters
    # (contexts: 40,960 and 262,144 positions)
    "Qwen/Qwen3-4B": ModelArch(36, 2560, 9728, 32, 8, 128, 151936, tied_embeddings=True, qk_norm=True, context=40960),
    "Qwen/Qwen3-4B-Instruct-2507": ModelArch(
        36, 2560, 9728, 32, 8, 128, 151936, tied_embeddings=True, qk_norm=True, context=262144
    ),
    # SmolLM2-135M-Instruct (the embedded smollm2-135m): 134.5M parameters
    "smollm2-135m": ModelArch(30, 576, 1536, 9, 3, 64, 49152, tied_embeddings=True, context=8192),
}


def arch_from_hf_config(config: dict) -> ModelArch:
    """The architecture from a ``config.json`` mapping."""
    missing = [k for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size") if k not in config]
    if missing:
        raise ValueError(f"model config lacks {', '.join(missing)} (not a decoder-only transformer config?)")
    heads = config.get("num_attention_heads", 1)
    return ModelArch(
        layers=config["num_hidden_layers"],
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"],
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qk_norm=str(config.get("model_type", "")).startswith("qwen3"),
        context=int(config.get("max_position_embeddings") or 0),
    )


def model_arch(name: str) -> tuple[ModelArch, str]:
    """(architecture, where it came from) for an ``llm.model`` value, without downloading weights."""
    if name in KNOWN_ARCHITECTURES and name != "tiny":
        return KNOWN_ARCHITECTURES[name], "known architecture table"
    if name == "tiny":
        from palaestra.shared.llm.tiny import tiny_path

        path = tiny_path()
        return arch_from_hf_config(json.loads((path / "config.json").read_text())), str(path)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return arch_from_hf_config(json.loads((path / "config.json").read_text())), str(path / "config.json")
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(name, local_files_only=True)
        return arch_from_hf_config(config.to_dict()), "the Hugging Face cache"
    except Exception:
        known = ", ".join(KNOWN_ARCHITECTURES)
        raise ValueError(
            f"model {name!r}: no config.json found offline and not in the known architectures ({known})"
        ) from None


@dataclass
class LearnerShape:
    """The settings of a config that the estimate needs."""

    world_size: int
    strategy: str  # fsdp | ddp
    compute_bytes: int  # 2 (bf16/fp16) or 4 (fp32)
    master_bytes: int  # 4: fp32 master weights; 2: weights kept in bf16
    micro_batch_tokens: int
    gradient_checkpointing: bool
    reference_model: bool
    longest_row: int = 0
    """The longest row of a micro-batch (the attention mask is rows x L x L); 0: the whole micro-batch."""
    optimizer_offload: bool = False
    """AdamW's moments in CPU memory (``learner.optimizer_offload``): none on the device."""


def activation_bytes_per_token_layer(arch: ModelArch, c: int) -> int:
    """What autograd keeps per token in one decoder layer (see the module docstring)."""
    q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    norms = (4 + 2 * c) * 2 * arch.hidden + ((4 + c) * (q + kv) if arch.qk_norm else 0)
    return norms + c * (3 * q + 2 * kv) + 4 * c * arch.intermediate


def learner_memory(arch: ModelArch, shape: LearnerShape, on_gpu: bool = True) -> dict[str, float]:
    """Bytes per learner device, by part (see the module docstring); no runtime reserve off the GPU."""
    p, c, n = arch.params(), shape.compute_bytes, shape.world_size
    shard = n if shape.strategy == "fsdp" else 1
    t = shape.micro_batch_tokens
    optimizer_bytes = 8 if shape.master_bytes == 4 else 4  # AdamW's moments follow the parameter dtype
    per_layer = activation_bytes_per_token_layer(arch, c)
    full = arch.layers * per_layer * t
    checkpointed = arch.layers * c * arch.hidden * t + per_layer * t
    if shape.strategy == "fsdp" and n > 1:
        gathered = c * (arch.root_params() + 2 * arch.layer_params()) + 4 * arch.layer_params()
    else:
        gathered = c * p if c < shape.master_bytes else 0  # autocast's compute-dtype copies of the weights
    from palaestra.shared.rl.config import LOGIT_CHUNK_ELEMENTS

    chunk = min(t * arch.vocab, LOGIT_CHUNK_ELEMENTS)
    mask_elements = t * min(shape.longest_row or t, t)
    converted = c * mask_elements * (1 if shape.gradient_checkpointing else arch.layers)
    return {
        "weights": shape.master_bytes * p / shard,
        "gradients": shape.master_bytes * p / shard,
        "optimizer": 0.0 if shape.optimizer_offload else optimizer_bytes * p / shard,
        "gathered": gathered,
        "output_grad": c * arch.root_params() if shape.strategy == "fsdp" and n > 1 else 0.0,
        "reference": reference_bytes(shape) * p / shard if shape.reference_model else 0.0,
        "attention_mask": mask_elements + converted,
        "activations": checkpointed if shape.gradient_checkpointing else full,
        "activations_no_ckpt": full,
        "activations_ckpt": checkpointed,
        "logits": (2 * c + 5 * 4) * chunk,
        "reserve": RUNTIME_RESERVE_GB * GB if on_gpu else 0.0,
    }


def reference_bytes(shape: LearnerShape) -> int:
    """Bytes per parameter of the frozen reference: the compute dtype's when narrower than the master weights'
    (rl/policy.py `reference_dtype`: bf16 with bf16 compute), else the master weights'."""
    return min(shape.compute_bytes, shape.master_bytes)


def learner_shape(cfg, compute: int, master: int) -> LearnerShape:
    """The settings of an RL config's learner that the estimate reads (`compute`, `master`: bytes)."""
    learner = cfg.learner
    rows = cfg.minibatch_size or cfg.tasks_per_step * cfg.rollout.group_size
    longest = cfg.rollout.max_context_tokens
    budget = learner.micro_batch_tokens
    return LearnerShape(
        world_size=learner.world_size,
        strategy=learner.strategy,
        compute_bytes=compute,
        master_bytes=master,
        micro_batch_tokens=max(budget, longest) if budget else math.ceil(rows / learner.world_size) * longest,
        gradient_checkpointing=learner.gradient_checkpointing,
        reference_model=bool(cfg.loss.kl_coef) and not cfg.lora.enabled,
        longest_row=longest,
        optimizer_offload=learner.optimizer_offload,
    )


HELD = ("weights", "gradients", "optimizer", "reference")
"""What a policy holds for the whole run; its other parts live only while it scores or updates."""


@dataclass
class PoliciesPlan:
    """What several policies change in the plan of the run's learner (`policies_memory`)."""

    extra: float = 0.0
    """Bytes on the plan's learner device beyond the run's learner's parts."""
    lines: list[str] = field(default_factory=list)
    learner_gpus: int | None = None
    """The learners' GPUs (None: the run's learner's count)."""
    driver_bytes: float | None = None
    """Bytes on the trainer's GPU beside the sharded learners' ranks, its reserve left out (None: the run's)."""
    fits: bool = True
    """Whether the devices counted apart (sharded policies' ranks beside an in-process learner) fit."""


def policies_memory(
    cfg, first: dict[str, float], on_gpu: bool, compute: int, master: int, gpu_gb: float
) -> PoliciesPlan:
    """Several policies (``policies``, rl/policies.py): in the learner's process (world size 1) they update one at
    a time: every other policy's own weights, gradients, AdamW moments and reference, and the transient parts of
    the largest, beyond the run's learner's `first` parts. LoRA adapters on one base model: the base once (the
    parts above count every weight's gradient and moments, more than adapters' need). A policy with world size
    > 1 has its own ranks (`learner_total` per rank) and its float32 copy on the trainer's device (two while the
    reference is made: `trainer_weight_copies`)."""
    if len(cfg.policies) < 2:
        return PoliciesPlan()
    from palaestra.shared.rl.policy_configs import policy_config, shares_base

    if shares_base(cfg):
        return PoliciesPlan(lines=[f"  policies: {len(cfg.policies)} LoRA adapters on one base model (counted above)"])
    held = lambda parts: sum(parts[k] for k in HELD)  # noqa: E731
    transient = lambda parts: learner_total(parts) - held(parts) - parts["reserve"]  # noqa: E731
    own = {name: policy_config(cfg, name) for name in cfg.policies}
    sharded = {n for n, c in own.items() if c.learner.world_size > 1}
    device = lambda c: c.learner.num_gpus > 0 if c.learner.world_size > 1 else c.llm.device != "cpu"  # noqa: E731
    parts = {}
    for n, c in own.items():
        parts[n] = learner_memory(model_arch(c.llm.model)[0], learner_shape(c, compute, master), device(c))
    in_process = [parts[n] for n in own if n not in sharded]
    together = sum(held(p) for p in in_process) + max(map(transient, in_process), default=0.0)
    copies = sum(  # the sharded policies' float32 copies (and references while made) in the trainer's process
        trainer_weight_bytes(
            model_arch(own[n].llm.model)[0].params(), learner_shape(own[n], compute, master).reference_model, compute
        )
        for n in sharded
    )
    if not sharded:
        how = "one updating at a time"
    elif len(sharded) == len(own):
        how = "on ranks of its own (the total: the largest policy's rank)"
    else:
        how = "those in the learner's process updating one at a time, the others on ranks of their own"
    lines = [f"  policies: {len(own)}, each its own model, {how}:"]
    out = PoliciesPlan(lines=lines)
    for n, c in own.items():
        if n in sharded:
            rank = learner_total(parts[n])
            ok = rank <= gpu_gb * GB
            out.fits = out.fits and ok
            where = f"{c.learner.world_size} ranks x {c.learner.num_gpus:g} GPU, {c.learner.strategy}, per rank"
            lines.append(f"    {n} ({c.llm.model}): {where} {rank / GB:8.2f}  {'fits' if ok else 'DOES NOT FIT'}")
        else:
            lines.append(
                f"    {n} ({c.llm.model}): weights, gradients, optimizer, reference {held(parts[n]) / GB:8.2f}"
            )
    ranks = sum(math.ceil(own[n].learner.world_size * own[n].learner.num_gpus) for n in sharded)
    if cfg.learner.world_size > 1:  # the plan's device: a rank (the largest policy's); the rest on the trainer's
        out.extra = max(learner_total(parts[n]) for n in sharded) - learner_total(first) if sharded else 0.0
        out.driver_bytes = copies + together
        out.learner_gpus = ranks
    else:  # the plan's device: the trainer's learner, with the sharded policies' copies beside it
        reserve = first["reserve"] if in_process else 0.0
        out.extra = together + reserve + copies - learner_total(first)
        out.learner_gpus = (1 if on_gpu else 0) + ranks
    return out


def trainer_weight_bytes(params: int, reference_model: bool, compute_bytes: int) -> float:
    """Bytes of weights on the trainer's GPU at its peak (``learner.world_size`` > 1): its float32 model, and
    while it builds the reference (`Trainer.init_reference`, before the ranks take it over) a copy in the compute
    dtype (rl/policy.py `reference_copy`: bf16 on a GPU, made parameter by parameter)."""
    return 4 * params + (min(compute_bytes, 4) * params if reference_model else 0)


def learner_total(parts: dict[str, float]) -> float:
    return sum(v for k, v in parts.items() if k not in ("activations_no_ckpt", "activations_ckpt"))


def engine_tokens(arch: ModelArch, cfg) -> int:
    """The tokens a vLLM engine's KV cache must hold to start: its ``max_model_len``, the model's context (the
    backend sets no other), else the rollout's ``max_context_tokens`` where the context is unknown."""
    return arch.context or cfg.rollout.max_context_tokens


def vllm_memory(arch: ModelArch, gpu_gb: float, utilization: float, tensor_parallel: int) -> dict[str, float]:
    """Bytes per vLLM GPU: its budget, bf16 weights, the KV cache left and how many tokens that holds."""
    budget = utilization * gpu_gb * GB
    weights = 2 * arch.params() / tensor_parallel
    kv = budget - weights - VLLM_OVERHEAD_GB * GB
    per_token = 2 * arch.layers * arch.kv_heads * arch.head_dim * 2 / tensor_parallel
    return {"budget": budget, "weights": weights, "kv_cache": kv, "kv_tokens": max(kv, 0) / per_token}
