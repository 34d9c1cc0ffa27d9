"""An OpenAI-compatible HTTP server over any `LLMClient` (the transformers backend by default).

``palaestra serve MODEL`` runs it, so a local checkpoint can serve as a teacher
(datagen, AED) and the `openai` backend is tested against a real server.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages, tools,
temperature, top_p, max_tokens / max_completion_tokens, stop, n, seed,
logprobs), ``POST /v1/completions`` (prompt as text, token ids, or a batch of
either). No streaming.

Beyond the OpenAI schema, as vLLM does with ``return_token_ids``, every choice
carries ``token_ids`` (the generated ids, end-of-turn token included) and
``prompt_token_ids`` (also at the top level of chat responses), so that rollouts
through the server are token-exact. Chat choices also carry ``text``, the raw
generated text: ``message`` has the tool calls parsed out of it (OpenAI's
``tool_calls``; the thinking goes to ``reasoning_content``).

Concurrent requests are micro-batched: a worker thread takes the waiting
requests with equal sampling parameters (and no seed: a seeded request runs
alone so its result does not depend on its neighbours) into one `generate` call.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import astuple
from typing import Any

from palaestra.shared.llm.base import Completion, LLMClient, LLMConfig, LLMError, SamplingParams, make_client
from palaestra.shared.toolcall import parse_response

BATCH_WAIT_S = 0.005
"""How long the batcher waits for more requests to join a batch."""


class MicroBatcher:
    """Serializes generation on one client and merges concurrent compatible requests into one batch."""

    def __init__(self, client: LLMClient, max_prompts: int = 256) -> None:
        self.client, self.max_prompts = client, max_prompts
        self.requests: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True, name="palaestra-batcher").start()

    def generate(self, prompts: list, params: SamplingParams) -> list[Completion]:
        future: Future = Future()
        self.requests.put((prompts, params, future))
        return future.result()

    def _loop(self) -> None:
        held = None
        while True:
            first = held or self.requests.get()
            held = None
            group = [first]
            if first[1].seed is None:
                deadline = time.monotonic() + BATCH_WAIT_S
                while sum(len(g[0]) for g in group) < self.max_prompts:
                    try:
                        nxt = self.requests.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if nxt[1].seed is None and _key(nxt[1]) == _key(first[1]):
                        group.append(nxt)
                    else:
                        held = nxt
                        break
            self._run(group)

    def _run(self, group: list) -> None:
        prompts = [p for g in group for p in g[0]]
        try:
            outs = self.client.generate(prompts, group[0][1])
        except Exception as err:  # noqa: BLE001  (handed to each waiting request)
            for _, _, future in group:
                future.set_exception(err)
            return
        n = group[0][1].n
        start = 0
        for prompts_g, _, future in group:
            future.set_result(outs[start : start + len(prompts_g) * n])
            start += len(prompts_g) * n


def _key(params: SamplingParams) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in astuple(params))


def create_app(client: LLMClient, model_name: str):
    """The FastAPI app serving `client` under `model_name`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = FastAPI(title="palaestra serve")
    batcher = MicroBatcher(client)

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, f"invalid request: {exc.errors()[:2]}")

    def check(body: dict) -> JSONResponse | None:
        if body.get("model") not in (None, model_name):
            return error(404, f"model '{body.get('model')}' is not served here; this server serves '{model_name}'")
        if body.get("stream"):
            return error(400, "streaming is not supported by palaestra serve")
        return None

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "palaestra"}]}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    def chat_completions(body: dict[str, Any]) -> Any:
        if (bad := check(body)) is not None:
            return bad
        try:
            params = _sampling_params(body)
            messages, tools = body.get("messages"), body.get("tools")
            if not isinstance(messages, list) or not messages:
                return error(400, "'messages' must be a non-empty list")
            try:
                prompt = client.render(messages, tools=tools)
            except Exception as err:  # noqa: BLE001  (a template error is the request's fault)
                return error(400, f"cannot render messages with the chat template: {str(err).splitlines()[0]}")
            outs = batcher.generate([prompt], params)
        except (LLMError, ValueError, TypeError) as err:
            return error(400, str(err))
        want = bool(body.get("logprobs"))
        choices = [_chat_choice(i, out, client, bool(tools), want) for i, out in enumerate(outs)]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": _usage(outs),
            "prompt_token_ids": outs[0].prompt_token_ids,
        }

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]) -> Any:
        if (bad := check(body)) is not None:
            return bad
        try:
            params = _sampling_params(body)
            prompts = _prompts(body.get("prompt"))
            outs = batcher.generate(prompts, params)
        except (LLMError, ValueError, TypeError) as err:
            return error(400, str(err))
        want = body.get("logprobs") is not None and body.get("logprobs") is not False
        choices = [_completion_choice(i, out, client, want) for i, out in enumerate(outs)]
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": _usage(outs),
        }

    return app


def _sampling_params(body: dict) -> SamplingParams:
    """OpenAI's defaults: temperature 1, top_p 1, max_tokens 16."""
    stop = body.get("stop") or []
    given = lambda key, default: body[key] if body.get(key) is not None else default
    return SamplingParams(
        temperature=float(given("temperature", 1.0)),
        top_p=float(given("top_p", 1.0)),
        max_tokens=int(body.get("max_completion_tokens") or given("max_tokens", 16)),
        stop=[stop] if isinstance(stop, str) else list(stop),
        n=int(given("n", 1)),
        seed=body.get("seed"),
        logprobs=True,  # cheap to compute; returned when the request asks
    )


def _prompts(prompt: Any) -> list:
    """OpenAI's prompt forms: a string, a list of strings, a list of token ids, a list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return [prompt]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return list(prompt)
    raise ValueError("'prompt' must be a string, a list of strings, a list of token ids, or a list of such lists")


def _token_strings(client: LLMClient, ids: list[int]) -> list[str]:
    tok = getattr(client, "tokenizer", None)
    return [tok.decode([i]) for i in ids] if tok is not None else [f"token_id:{i}" for i in ids]


def _chat_choice(index: int, out: Completion, client: LLMClient, tools: bool, want_logprobs: bool) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": out.text}
    finish = out.finish_reason
    parsed = parse_response(out.text)
    if tools and parsed.calls and parsed.error is None:
        calls = [c.to_openai(f"call_{uuid.uuid4().hex[:24]}") for c in parsed.calls]
        message = {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}
        if parsed.thinking is not None:
            message["reasoning_content"] = parsed.thinking
        finish = "tool_calls" if finish == "stop" else finish
    logprobs = None
    if want_logprobs and out.logprobs is not None:
        tokens = _token_strings(client, out.token_ids)
        logprobs = {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(tokens, out.logprobs)
            ]
        }
    return {
        "index": index,
        "message": message,
        "finish_reason": finish,
        "logprobs": logprobs,
        "text": out.text,
        "token_ids": out.token_ids,
        "prompt_token_ids": out.prompt_token_ids,
    }


def _completion_choice(index: int, out: Completion, client: LLMClient, want_logprobs: bool) -> dict:
    logprobs = None
    if want_logprobs and out.logprobs is not None:
        tokens = _token_strings(client, out.token_ids)
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        logprobs = {"tokens": tokens, "token_logprobs": out.logprobs, "top_logprobs": None, "text_offset": offsets}
    return {
        "index": index,
        "text": out.text,
        "finish_reason": out.finish_reason,
        "logprobs": logprobs,
        "token_ids": out.token_ids,
        "prompt_token_ids": out.prompt_token_ids,
    }


def _usage(outs: list[Completion]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve_in_subprocess(model: str = "tiny", device: str = "cpu", threads: int = 1, timeout_s: float = 120.0):
    """Run ``palaestra serve MODEL`` on a free loopback port in a child process; yields its base URL (``.../v1``).

    For tests and local teachers; the process is terminated on exit.
    """
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "palaestra.shared.cli", "serve", model, "--port", str(port), "--device", device]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-1:]
                    raise LLMError(f"palaestra serve {model} exited with {proc.returncode}: {' '.join(tail)}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise LLMError(f"palaestra serve {model} did not answer within {timeout_s:.0f} s") from None
                    time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def serve(config: LLMConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Load `config`'s model and serve it until interrupted."""
    import uvicorn

    client = make_client(config)
    app = create_app(client, config.model)
    print(f"palaestra serve: {config.model} ({config.backend}) on http://{host}:{port}/v1", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
