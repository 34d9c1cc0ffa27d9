"""What every endpoint of ``palaestra serve`` shares: the served model and batcher, the API key check, the model
check, waiting for a job (cancelled when its client disconnects), and the server-sent-event stream of a job.

Imported by `create_app` only, after the ``serve`` extra is checked (it imports fastapi).
"""

import asyncio
import json
import secrets
import time

from fastapi import Request

from palaestra.shared.llm.base import LLMClient, LLMError
from palaestra.shared.llm.serve.batcher import Cancelled, MicroBatcher, ServeRequest
from palaestra.shared.llm.serve.model import RequestError, ServedModel, ServeLimits
from palaestra.shared.llm.serve.stream import TextStream


class Server:
    """`client` served under `model_name`, within `limits`, behind `api_key` when one is set."""

    def __init__(self, client: LLMClient, model_name: str, limits: ServeLimits, api_key: str | None) -> None:
        self.client, self.model_name, self.limits, self.api_key = client, model_name, limits, api_key
        self.model = ServedModel(client)
        self.batcher = MicroBatcher(client, max_prompts=limits.max_batch_prompts, max_queue=limits.max_queue)
        self.started = int(time.time())

    async def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise RequestError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", "invalid_api_key")

    def admit(self, body) -> None:
        if body.model not in (None, self.model_name):
            message = f"model '{body.model}' is not served here; this server serves '{self.model_name}'"
            raise RequestError(404, message, "model_not_found", "model")

    async def outcome(self, request: Request, job: ServeRequest) -> list:
        """The job's completions; cancels the job if the client disconnects first."""
        future = asyncio.wrap_future(self.batcher.submit(job))
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

    def stream(self, job: ServeRequest, header: dict, first: list[dict], piece, last, usage: bool, pieces: bool = True):
        """Server-sent events: the `first` choices, `piece(index, text)` as text is generated, `last(index, out,
        rest)` per choice, the usage if asked, ``[DONE]``. Without `pieces` the whole text comes with `last`."""
        from fastapi.responses import StreamingResponse

        from palaestra.shared.llm.serve import protocol as wire

        model, loop = self.model, asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        streams = [TextStream(model.tokenizer, model.end_ids, job.params.stop) for _ in range(_choices(job))]
        if pieces and model.tokenizer is not None:

            def on_token(index: int, token: int) -> None:
                loop.call_soon_threadsafe(events.put_nowait, (index, token))

            job.on_token = on_token
        future = self.batcher.submit(job)
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
                    yield f"data: {json.dumps(wire.error_body(status, first_line(err), kind))}\n\n"
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


def _choices(job: ServeRequest) -> int:
    return len(job.prompts) * job.params.n


def _status(err: Exception) -> tuple[int, str]:
    """HTTP status and error type of a generation's failure."""
    if isinstance(err, Cancelled):
        return 503, "server_unavailable"
    if isinstance(err, LLMError):
        return 400, "invalid_request_error"
    return 500, "server_error"


def first_line(err: BaseException) -> str:
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
