"""``POST /v1/completions``: raw prompts (text or token ids), one choice per prompt and ``n``, logprobs on request;
streamed as text pieces."""

import time
import uuid
from typing import Any

from palaestra.shared.llm.serve import protocol as wire
from palaestra.shared.llm.serve.batcher import ServeRequest
from palaestra.shared.llm.serve.server import Server


def add_routes(app, server: Server) -> None:
    from fastapi import Depends, Request

    @app.post("/v1/completions", dependencies=[Depends(server.authorize)])
    async def completions(body: wire.CompletionRequest, request: Request) -> Any:
        server.admit(body)
        want = body.wants_logprobs()
        top = body.logprobs if isinstance(body.logprobs, int) and not isinstance(body.logprobs, bool) else 0
        params = body.sampling(top)
        job = ServeRequest(server.model.prompt_ids(body.prompt_list(), params, server.limits), params)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            header: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created}
            header["model"] = server.model_name
            usage = bool(body.stream_options and body.stream_options.include_usage)

            def piece(i: int, text: str) -> dict:
                return {"index": i, "text": text, "logprobs": None, "finish_reason": None}

            def last(i: int, out, rest: str) -> dict:
                choice = wire.completion_choice(i, out, server.model.tokenizer, want, top)
                return {**choice, "text": rest}

            return server.stream(job, header, [], piece, last, usage)
        outs = await server.outcome(request, job)
        tokenizer = server.model.tokenizer
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": server.model_name,
            "choices": [wire.completion_choice(i, out, tokenizer, want, top) for i, out in enumerate(outs)],
            "usage": wire.usage(outs),
        }
