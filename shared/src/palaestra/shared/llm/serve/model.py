"""What ``palaestra serve`` admits: the limits on one request and on all of them (`ServeLimits`), the refusal of a
request (`RequestError`: an HTTP status and an OpenAI-style error body), the check that the ``serve`` extra is
installed (`server_stack`), and what validation knows of the served model (`ServedModel`: its tokenizer,
vocabulary and context, turning prompts into checked token ids)."""

from dataclasses import dataclass

from palaestra.shared.extras import require
from palaestra.shared.llm.base import LLMClient, LLMError, SamplingParams


@dataclass
class ServeLimits:
    """What one request, and all of them together, may ask of the server."""

    max_queue: int = 64
    """Requests waiting or running at once; more are refused with 503."""
    max_request_tokens: int = 32768
    """Prompts x n x max_tokens of one request; more is refused with 400."""
    max_batch_prompts: int = 256
    """Prompts the batcher merges into one generate call."""
    max_body_bytes: int = 16 << 20
    """Largest request body; larger ones get 413 before they are read."""


class RequestError(Exception):
    """A request the server refuses: an HTTP status and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def server_stack() -> None:
    """fastapi, uvicorn and pydantic are importable, or `MissingExtraError` names the ``serve`` extra."""
    for module in ("fastapi", "uvicorn", "pydantic"):
        require(module, "serve", "palaestra serve")


class ServedModel:
    """What validation needs to know about the served model."""

    def __init__(self, client: LLMClient) -> None:
        try:
            self.tokenizer = client.tokenizer
        except LLMError:  # a proxied remote model without a local tokenizer: prompts pass through as given
            self.tokenizer = None
        self.context = getattr(client, "context_length", None)
        self.vocab = len(self.tokenizer) if self.tokenizer is not None else 0
        embeddings = getattr(getattr(client, "model", None), "get_input_embeddings", None)
        if self.tokenizer is not None and embeddings is not None:
            self.vocab = min(self.vocab, embeddings().num_embeddings)
        self.end_ids = list(getattr(client, "eos_token_ids", []))

    def prompt_ids(self, prompts: list, params: SamplingParams, limits: ServeLimits, param: str = "prompt") -> list:
        asked = len(prompts) * params.n * params.max_tokens
        if asked > limits.max_request_tokens:
            raise RequestError(
                400,
                f"this request asks for up to {asked} generated tokens ({len(prompts)} prompt(s) x n={params.n} x "
                f"max_tokens={params.max_tokens}); this server allows {limits.max_request_tokens} per request "
                "(--max-request-tokens)",
                param="max_tokens",
            )
        if self.tokenizer is None:
            return prompts
        out = []
        for i, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else prompt
            if not ids:
                raise RequestError(400, f"prompt {i} is empty (no tokens)", param=param)
            bad = next((t for t in ids if not 0 <= t < self.vocab), None)
            if bad is not None:
                message = f"prompt {i}: token id {bad} is not in the vocabulary (0..{self.vocab - 1})"
                raise RequestError(400, message, param=param)
            if self.context is not None and len(ids) >= self.context:
                what = "the messages render to" if param == "messages" else f"prompt {i} has"
                message = f"{what} {len(ids)} tokens; the model's context is {self.context} tokens"
                raise RequestError(400, message, param=param)
            out.append(list(ids))
        return out
