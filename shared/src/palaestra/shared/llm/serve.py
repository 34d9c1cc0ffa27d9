"""An OpenAI-compatible HTTP server over any `LLMClient` (the transformers backend by default).

``palaestra serve MODEL`` (`serve_launch.serve`) runs it, so a local checkpoint can serve as a teacher
(datagen, AED) and the `openai` backend is tested against a real server.
Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST
/v1/completions``, ``GET /health``; the wire format (request models, choices,
stream chunks) is in `serve_protocol`, generation in `serve_batcher`.

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

import asyncio
import json
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from palaestra.shared.extras import require
from palaestra.shared.llm.base import LLMClient, LLMError, SamplingParams
from palaestra.shared.llm.serve_batcher import Cancelled, Job, MicroBatcher, Overloaded
from palaestra.shared.llm.serve_stream import TextStream


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


class _Model:
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
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    from palaestra.shared.llm import serve_protocol as wire

    limits = limits or ServeLimits()
    model = _Model(client)
    batcher = MicroBatcher(client, max_prompts=limits.max_batch_prompts, max_queue=limits.max_queue)
    app = FastAPI(title="palaestra serve")
    app.state.batcher = batcher
    app.add_middleware(wire.BodyLimit, limit=limits.max_body_bytes)
    started = int(time.time())

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
        return error(500, f"generation failed: {type(exc).__name__}: {_first_line(exc)}", "server_error")

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise RequestError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", "invalid_api_key")

    def admit(body) -> None:
        if body.model not in (None, model_name):
            message = f"model '{body.model}' is not served here; this server serves '{model_name}'"
            raise RequestError(404, message, "model_not_found", "model")

    async def outcome(request: Request, job: Job) -> list:
        """The job's completions; cancels the job if the client disconnects first."""
        future = asyncio.wrap_future(batcher.submit(job))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({future, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not future.done():
                job.cancel()
                future.add_done_callback(_retrieve)  # nobody awaits it any more: no "never retrieved" warning
        if not future.done():
            raise Cancelled("the client disconnected")
        try:
            return future.result()
        except LLMError as err:
            raise RequestError(400, str(err)) from None

    def stream(job: Job, header: dict, first: list[dict], piece, last, usage: bool, pieces: bool = True):
        """Server-sent events: the `first` choices, `piece(index, text)` as text is generated, `last(index, out,
        rest)` per choice, the usage if asked, ``[DONE]``. Without `pieces` the whole text comes with `last`."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        streams = [TextStream(model.tokenizer, model.end_ids, job.params.stop) for _ in range(_choices(job))]
        if pieces and model.tokenizer is not None:

            def on_token(index: int, token: int) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (index, token))

            job.on_token = on_token
        future = batcher.submit(job)
        future.add_done_callback(lambda _: _call_soon(loop, events.put_nowait, None))

        def event(choices: list[dict], **extra) -> str:
            return f"data: {json.dumps({**header, 'choices': choices, **extra})}\n\n"

        async def body():
            try:
                if first:
                    yield event(first)
                while (item := await events.get()) is not None:
                    index, token = item
                    if text := streams[index].push(token):
                        yield event([piece(index, text)])
                try:
                    outs = future.result()
                except Exception as err:  # noqa: BLE001  (the stream has begun: the error is its last event)
                    status, kind = _status(err)
                    yield f"data: {json.dumps(wire.error_body(status, _first_line(err), kind))}\n\n"
                else:
                    for index, out in enumerate(outs):
                        yield event([last(index, out, streams[index].rest(out.text))])
                    if usage:
                        yield event([], usage=wire.usage(outs))
                yield "data: [DONE]\n\n"
            finally:
                if not future.done():
                    job.cancel()

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": started, "owned_by": "palaestra"}],
        }

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(body: wire.ChatRequest, request: Request) -> Any:
        admit(body)
        tools = body.tool_dicts()
        try:
            prompt = client.render([m.for_template() for m in body.messages], tools=tools)
        except Exception as err:  # noqa: BLE001  (a template error is the request's fault)
            message = f"cannot render messages with the chat template: {str(err).splitlines()[0]}"
            raise RequestError(400, message, param="messages") from None
        top = (body.top_logprobs or 0) if body.logprobs else 0
        params = body.sampling(top)
        job = Job(model.prompt_ids([prompt], params, limits, "messages"), params)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            header = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}
            header["prompt_token_ids"] = job.prompts[0]
            first = [wire.chat_chunk(i, {"role": "assistant", "content": ""}) for i in range(params.n)]

            def piece(i: int, text: str) -> dict:
                return wire.chat_chunk(i, {"content": text})

            def last(i: int, out, rest: str) -> dict:
                return wire.chat_last_chunk(i, out, rest, model.tokenizer, bool(tools), bool(body.logprobs), top)

            usage = bool(body.stream_options and body.stream_options.include_usage)
            # with tools the turn is parsed whole, so it arrives in the last chunk
            return stream(job, header, first, piece, last, usage, pieces=not tools)
        outs = await outcome(request, job)
        choices = [
            wire.chat_choice(i, out, model.tokenizer, bool(tools), bool(body.logprobs), top)
            for i, out in enumerate(outs)
        ]
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model_name,
            "choices": choices,
            "usage": wire.usage(outs),
            "prompt_token_ids": outs[0].prompt_token_ids,
        }

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: wire.CompletionRequest, request: Request) -> Any:
        admit(body)
        want = body.wants_logprobs()
        top = body.logprobs if isinstance(body.logprobs, int) and not isinstance(body.logprobs, bool) else 0
        params = body.sampling(top)
        job = Job(model.prompt_ids(body.prompt_list(), params, limits), params)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            header: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model_name}
            usage = bool(body.stream_options and body.stream_options.include_usage)

            def piece(i: int, text: str) -> dict:
                return {"index": i, "text": text, "logprobs": None, "finish_reason": None}

            def last(i: int, out, rest: str) -> dict:
                choice = wire.completion_choice(i, out, model.tokenizer, want, top)
                return {**choice, "text": rest}

            return stream(job, header, [], piece, last, usage)
        outs = await outcome(request, job)
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model_name,
            "choices": [wire.completion_choice(i, out, model.tokenizer, want, top) for i, out in enumerate(outs)],
            "usage": wire.usage(outs),
        }

    return app


def _choices(job: Job) -> int:
    return len(job.prompts) * job.params.n


def _status(err: Exception) -> tuple[int, str]:
    """HTTP status and error type of a generation's failure."""
    if isinstance(err, Cancelled):
        return 503, "server_unavailable"
    if isinstance(err, LLMError):
        return 400, "invalid_request_error"
    return 500, "server_error"


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [""])[0]


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _call_soon(loop: asyncio.AbstractEventLoop, fn, *args) -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(fn, *args)


async def _disconnected(request) -> None:
    """Returns once the client has gone away (the body is already read, so only a disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
