"""An OpenAI-compatible HTTP server over any `LLMClient` (the transformers backend by default).

``palaestra serve MODEL`` (`launch.serve`) runs it, so a local checkpoint can serve as a teacher (datagen, AED)
and the `openai` backend is tested against a real server.
Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST
/v1/completions``, ``GET /health``; the wire format (request models, choices,
stream chunks) is in `protocol`, generation in `batcher`; each endpoint is
its own module (`chat`, `completions`, `info`) over the `Server` they share.

What keeps one client from hurting the others:

- every request is validated on its own before it joins a batch: its body by
  pydantic models (400 with an OpenAI-style error body), its prompts by the
  tokenizer (token ids outside the vocabulary, an empty or too long prompt);
- the work per request is capped: prompts x n x max_tokens at most
  ``max_request_tokens`` (400 beyond), and at most ``max_queue`` requests wait
  or run at once (503 with ``Retry-After`` beyond);
- a client that disconnects (during a streamed or a plain request) has its
  generation cancelled: its rows end at the next decode step;
- on SIGTERM or SIGINT every generation is cancelled and the server exits
  within seconds;
- an optional API key (``--api-key`` or ``PALAESTRA_API_KEY``) is checked as
  ``Authorization: Bearer KEY``; binding beyond loopback without one warns.

What it does not do: continuous batching. A batch runs to its end before the
next one starts, so a long request delays the requests that arrive during it
by up to its own length (bounded by ``max_request_tokens``, ended early if its
client disconnects).

Streaming sends server-sent events as the OpenAI API does: text pieces as the
tokens are generated; each choice's last chunk carries its finish reason, and
its logprobs, ``token_ids`` and raw ``text`` whole (with tools, or a backend that
generates in one piece such as vLLM: the whole turn comes in that last chunk).
"""

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


def create_app(client: LLMClient, model_name: str, limits: ServeLimits | None = None, api_key: str | None = None):
    """The FastAPI app serving `client` under `model_name`; its batcher is ``app.state.batcher``."""
    server_stack()
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from palaestra.shared.llm.serve import chat, completions, info
    from palaestra.shared.llm.serve import protocol as wire
    from palaestra.shared.llm.serve.batcher import Cancelled, Overloaded
    from palaestra.shared.llm.serve.server import Server, first_line

    server = Server(client, model_name, limits or ServeLimits(), api_key)
    app = FastAPI(title="palaestra serve")
    app.state.batcher = server.batcher
    app.add_middleware(wire.BodyLimit, limit=server.limits.max_body_bytes)

    def error(status: int, message: str, kind: str = "invalid_request_error", param=None, headers=None):
        return JSONResponse(wire.error_body(status, message, kind, param), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = wire.validation_message(list(exc.errors()))
        return error(400, message, param=param)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:
        return error(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(Overloaded)
    async def _busy(request: Request, exc: Overloaded) -> JSONResponse:
        return error(503, str(exc), "server_overloaded", headers={"Retry-After": "1"})

    @app.exception_handler(Cancelled)
    async def _cancelled(request: Request, exc: Cancelled) -> JSONResponse:
        return error(503, str(exc), "server_unavailable")

    @app.exception_handler(Exception)
    async def _failed(request: Request, exc: Exception) -> JSONResponse:
        return error(500, f"generation failed: {type(exc).__name__}: {first_line(exc)}", "server_error")

    info.add_routes(app, server)
    chat.add_routes(app, server)
    completions.add_routes(app, server)
    return app
