"""``POST /v1/chat/completions``: messages rendered with the chat template (tools included), one choice per
``n``, tool calls parsed from the turn; streamed as chat chunks (with tools, the whole turn in the last one)."""

import time
import uuid
from typing import Any

from palaestra.shared.llm.serve import protocol as wire
from palaestra.shared.llm.serve.batcher import ServeRequest
from palaestra.shared.llm.serve.model import RequestError
from palaestra.shared.llm.serve.server import Server


def add_routes(app, server: Server) -> None:
    from fastapi import Depends, Request

    @app.post("/v1/chat/completions", dependencies=[Depends(server.authorize)])
    async def chat_completions(body: wire.ChatRequest, request: Request) -> Any:
        server.admit(body)
        tools = body.tool_dicts()
        try:
            prompt = server.client.render([m.for_template() for m in body.messages], tools=tools)
        except Exception as err:  # noqa: BLE001  (a template error is the request's fault)
            message = f"cannot render messages with the chat template: {str(err).splitlines()[0]}"
            raise RequestError(400, message, param="messages") from None
        top = (body.top_logprobs or 0) if body.logprobs else 0
        params = body.sampling(top)
        job = ServeRequest(server.model.prompt_ids([prompt], params, server.limits, "messages"), params)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            header = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": server.model_name}
            header["prompt_token_ids"] = job.prompts[0]
            first = [wire.chat_chunk(i, {"role": "assistant", "content": ""}) for i in range(params.n)]

            def piece(i: int, text: str) -> dict:
                return wire.chat_chunk(i, {"content": text})

            def last(i: int, out, rest: str) -> dict:
                return wire.chat_last_chunk(i, out, rest, server.model.tokenizer, bool(tools), bool(body.logprobs), top)

            usage = bool(body.stream_options and body.stream_options.include_usage)
            # with tools the turn is parsed whole, so it arrives in the last chunk
            return server.stream(job, header, first, piece, last, usage, pieces=not tools)
        outs = await server.outcome(request, job)
        choices = [
            wire.chat_choice(i, out, server.model.tokenizer, bool(tools), bool(body.logprobs), top)
            for i, out in enumerate(outs)
        ]
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": server.model_name,
            "choices": choices,
            "usage": wire.usage(outs),
            "prompt_token_ids": outs[0].prompt_token_ids,
        }
