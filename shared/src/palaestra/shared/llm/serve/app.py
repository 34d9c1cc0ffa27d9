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

from palaestra.shared.llm.base import LLMClient
from palaestra.shared.llm.serve.model import RequestError, ServeLimits, server_stack


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
