"""LLM clients: transformers (default), vLLM, any OpenAI-compatible server; embedded models."""

from palaestra.shared.llm.base import (
    LLM_BACKENDS,
    Completion,
    LLMClient,
    LLMConfig,
    LLMError,
    SamplingParams,
    make_client,
)

__all__ = ["LLM_BACKENDS", "Completion", "LLMClient", "LLMConfig", "LLMError", "SamplingParams", "make_client"]
