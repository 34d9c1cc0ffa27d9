"""The LLM client interface that every backend implements.

`LLMClient.generate` takes prompts as token ids (token-in, token-out: the
rollout engine never decodes and re-tokenizes) or as text, and returns
`Completion`s with the generated token ids and their logprobs. `chat`
renders messages (with tools) through the model's chat template first.

Backends register in `LLM_BACKENDS` under the name used in ``llm.backend``;
they are imported only when chosen.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from palaestra.shared.config import value_check
from palaestra.shared.config_checks import registry_name
from palaestra.shared.registry import Registry


class LLMError(RuntimeError):
    """A user-facing LLM failure (model not found, server unreachable, prompt too long)."""


class DType(StrEnum):
    """Weights' dtype: ``auto`` is fp32 on CPU and bf16 on GPU."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class LogprobsMode(StrEnum):
    """Which distribution a sampled token's log-prob is taken from (``llm.logprobs_mode``; vLLM's names).

    ``raw``: log-softmax of the model's raw logits, before temperature, top-k and top-p: the model itself (what
    the learner's untempered scoring reproduces). ``processed``: the distribution the token was actually drawn
    from: the logits tempered, truncated by top-k and top-p, renormalized. The decoupled-PPO behaviour
    correction needs ``processed`` (the behaviour policy is what sampled); the two agree at temperature 1
    without top-k / top-p. Greedy decoding (temperature 0) logs the raw log-prob in both modes."""

    raw = "raw"
    processed = "processed"


@dataclass
class LLMConfig:
    """Which model, through which backend."""

    backend: str = field(default="transformers", metadata=registry_name("palaestra.shared.llm.base:LLM_BACKENDS"))
    """transformers | vllm | openai (or a registered plugin)."""
    model: str = field(default="tiny", metadata=value_check("palaestra.shared.llm.models:check_model_name"))
    """tiny | smollm2-135m | a local HF directory | a hub id (where a hub is reachable) | a served model name."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N (transformers backend)."""
    dtype: DType = DType.auto
    """auto (fp32 on CPU, bf16 on GPU) | float32 | bfloat16 | float16."""
    base_url: str | None = None
    """OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (openai backend)."""
    api_key: str | None = None
    """API key (openai backend); default: the OPENAI_API_KEY variable, else a placeholder."""
    max_retries: int = 3
    """Retries with exponential backoff (openai backend)."""
    timeout_s: float = 60.0
    """Per-request timeout (openai backend)."""
    max_batch_size: int = 64
    """Largest batch the backend generates at once (transformers backend)."""
    hf_generate: bool = False
    """Decode with transformers' ``model.generate`` instead of the backend's own loop (transformers backend; the
    loop gives the same greedy tokens and samples by the same rule, faster: see ``palaestra.shared.llm.hf_decode``)."""
    gpu_memory_utilization: float = 0.5
    """Share of GPU memory for vLLM's KV cache (vllm backend)."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism (vllm backend)."""
    vllm_segment_tokens: int = field(default=16, metadata=value_check("palaestra.shared.config:check_positive"))
    """Interruptible generation on the vllm backend (llm/vllm_interrupt.py): tokens per segment, the points at
    which newer weights may land inside one generation (the transformers loop: every token)."""
    sleep_mode: bool = False
    """Build the engine with vLLM's sleep mode (``enable_sleep_mode``; vllm backend, GPU only: vLLM's CPU build
    refuses it), so that it frees its GPU memory while a colocated learner updates (llm/sleep_mode.py)."""
    seed: int = 0
    """Seed for building the `tiny` model's random weights."""
    logprobs_mode: LogprobsMode = LogprobsMode.raw
    """raw | processed: each sampled token's log-prob under the raw logits, or under the tempered, truncated
    distribution it was drawn from (`LogprobsMode`; transformers and vllm backends)."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """Sample only among the k most likely tokens; 0 = off (transformers and vllm backends; the openai backend
    sends it as vLLM's extra body field ``top_k``, which ``palaestra serve`` and vLLM honour)."""
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    """Stop strings; the completion ends after the first one (included in the text)."""
    n: int = 1
    """Completions per prompt (returned consecutively)."""
    seed: int | None = None
    """Makes sampling reproducible (transformers and vllm backends)."""
    logprobs: bool = True
    top_logprobs: int = 0
    """How many most likely tokens to return, with their logprobs, for each generated token (in
    ``Completion.extra["top_logprobs"]`` as ``[[token_id, logprob], ...]`` per token; transformers backend)."""


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    text: str
    token_ids: list[int]
    logprobs: list[float] | None
    """Log-probability of each generated token: under the model's raw logits (before temperature and top-k /
    top-p), or with ``llm.logprobs_mode: processed`` under the distribution it was drawn from."""
    prompt_token_ids: list[int]
    finish_reason: str
    """stop | length."""
    extra: dict[str, Any] = field(default_factory=dict)


class LLMClient:
    """Base class of the backends."""

    config: LLMConfig
    tokenizer: Any  # a transformers tokenizer with the project's chat template
    model: Any  # the local model (transformers backend: a causal LM); remote backends have none

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams | None = None) -> list[Completion]:
        raise NotImplementedError

    @property
    def interruptible(self) -> bool:
        """Whether `generate` takes ``at_boundary`` (weights that may change between tokens: hf_decode)."""
        return False

    def chat(
        self,
        conversations: list[list[dict]],
        params: SamplingParams | None = None,
        tools: list[dict] | list[list[dict]] | None = None,
    ) -> list[Completion]:
        """Generate one assistant turn for each conversation (OpenAI-style messages)."""
        per_conversation = typing.cast(list[list[dict]], tools) if is_per_conversation(tools) else None
        shared = None if per_conversation is not None else typing.cast(list[dict] | None, tools)
        prompts = [
            self.render(conv, per_conversation[i] if per_conversation is not None else shared)
            for i, conv in enumerate(conversations)
        ]
        return self.generate(prompts, params)

    def render(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> list[int]:
        """Prompt token ids for `messages` through the chat template."""
        return list(
            self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                tokenize=True,
                add_generation_prompt=add_generation_prompt,
                return_dict=False,
            )
        )

    def load_weights(self, state_dict: dict) -> None:
        """Replace the model weights (weight sync from a learner)."""
        raise NotImplementedError(f"{type(self).__name__} does not take weight updates")

    def close(self) -> None:
        pass


def is_per_conversation(tools) -> bool:
    return bool(tools) and isinstance(tools[0], list)


LLM_BACKENDS: Registry[type[LLMClient]] = Registry("LLM backend", "palaestra.llm_backends")
LLM_BACKENDS.register("transformers", "palaestra.shared.llm.hf_backend:TransformersClient")
LLM_BACKENDS.register("openai", "palaestra.shared.llm.openai_backend:OpenAIClient")
LLM_BACKENDS.register("vllm", "palaestra.shared.llm.vllm_backend:VLLMClient")


def make_client(cfg: LLMConfig) -> LLMClient:
    """The client of `cfg.backend` for `cfg.model`."""
    backend: Any = LLM_BACKENDS.get(cfg.backend)  # a subclass whose constructor takes the config
    return backend(cfg)
