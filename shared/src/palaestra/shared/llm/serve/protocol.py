"""The OpenAI wire format of ``palaestra serve``: request models, error bodies, response and stream chunks.

- Request models are pydantic models, as FastAPI intends: a message without
  ``role``, ``max_tokens=2.7``, a NaN or infinite ``temperature``, a negative
  ``n`` fail validation and the server answers 400 with an OpenAI-style error
  body (``{"error": {"message", "type", "param", "code"}}``). OpenAI parameters
  that this server cannot honour (``frequency_penalty``, ``logit_bias``,
  ``echo``, a JSON ``response_format``, ...) are refused when set to anything
  but their neutral value; parameters it does not know are ignored, as vLLM
  does (clients send extras such as ``user``).
- Responses: `chat_choice` and `completion_choice` build one choice; beyond the
  OpenAI schema, as vLLM does with ``return_token_ids``, every choice carries
  ``token_ids`` and ``prompt_token_ids``, and chat choices the raw ``text``.
- `BodyLimit` answers 413 to a body larger than the server takes, before
  reading it.

This module imports pydantic: only ``palaestra serve`` loads it.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from palaestra.shared.llm.base import Completion, SamplingParams
from palaestra.shared.toolcall import parse_response

MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on ``top_logprobs``."""
MAX_STOPS, MAX_STOP_CHARS = 16, 512
"""Stop strings are checked against the tail of the text at every decode step: keep them few and short."""


def _finite(value: Any) -> Any:
    """A JSON number that is finite (JSON parsers here accept NaN and Infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value}")
    return value


Number = Annotated[float, BeforeValidator(_finite)]
Temperature = Annotated[float, BeforeValidator(_finite), Field(ge=0)]
TopP = Annotated[float, BeforeValidator(_finite), Field(gt=0, le=1)]
Count = Annotated[StrictInt, Field(ge=1)]
Seed = Annotated[StrictInt, Field(ge=0, lt=2**63)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Model):
    type: Literal["text"]
    """Only text parts: this server serves text models."""
    text: StrictStr


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None
    reasoning_content: StrictStr | None = None

    def for_template(self) -> dict:
        """The message as the chat template reads it (text parts joined; unset fields left out)."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "".join(part.text for part in self.content)
        return message


class FunctionSpec(_Model):
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Model):
    type: Literal["function"] = "function"
    function: FunctionSpec


class StreamOptions(_Model):
    include_usage: StrictBool = False


class _SamplingRequest(_Model):
    """The fields chat and completions requests share."""

    model: StrictStr | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: StrictInt | None = None
    """vLLM's extra field: sample among the k most likely tokens; 0 or -1 = off."""
    max_tokens: Count | None = None
    n: Count | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: Seed | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool | None = None
    """vLLM's flag; token ids are always returned."""
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    logit_bias: dict[str, Any] | None = None
    best_of: StrictInt | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _only_what_is_honoured(self):
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0):
                raise ValueError(f"{name} is not supported by palaestra serve (only 0)")
        if self.top_k is not None and self.top_k < -1:
            raise ValueError(f"top_k must be >= -1 (0 or -1 = off), got {self.top_k}")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by palaestra serve")
        if self.best_of not in (None, 1):
            raise ValueError("best_of is not supported by palaestra serve (only 1)")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("response_format other than 'text' is not supported by palaestra serve")
        if any(not s for s in self.stops()):
            raise ValueError("stop strings must not be empty")
        if len(self.stops()) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in self.stops()):
            raise ValueError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, top_logprobs: int) -> SamplingParams:
        """OpenAI's defaults: temperature 1, top_p 1, n 1; max_tokens 16 (the completions API's; chat keeps it too,
        so a request that names no max_tokens stays small)."""
        return SamplingParams(
            temperature=float(self.temperature if self.temperature is not None else 1.0),
            top_p=float(self.top_p if self.top_p is not None else 1.0),
            top_k=max(self.top_k or 0, 0),
            max_tokens=self.max_tokens_asked(),
            stop=self.stops(),
            n=self.n or 1,
            seed=self.seed,
            logprobs=True,  # cheap to compute; returned when the request asks
            top_logprobs=top_logprobs,
        )

    def max_tokens_asked(self) -> int:
        return self.max_tokens or 16


class ChatRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["auto", "none"] | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    max_completion_tokens: Count | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _chat_checks(self):
        if isinstance(self.tool_choice, dict):
            raise ValueError("tool_choice naming a function is not supported by palaestra serve ('auto' or 'none')")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    def max_tokens_asked(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 16

    def tool_dicts(self) -> list[dict] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]


TokenIds = list[StrictInt]


class CompletionRequest(_SamplingRequest):
    prompt: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | StrictBool | None = None
    """The legacy API's form: how many top tokens to list per token (0: only the sampled one)."""
    echo: StrictBool = False
    suffix: StrictStr | None = None

    @model_validator(mode="after")
    def _completion_checks(self):
        if self.echo:
            raise ValueError("echo is not supported by palaestra serve")
        if self.suffix:
            raise ValueError("suffix is not supported by palaestra serve")
        if isinstance(self.prompt, list) and (not self.prompt or any(p == [] for p in self.prompt)):
            raise ValueError("prompt must not be empty")
        return self

    def prompt_list(self) -> list:
        """A string, a list of strings, a list of token ids, a list of token-id lists -> a list of prompts."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]
        return list(self.prompt)

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None and self.logprobs is not False


def error_body(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


_MEMBER_TAGS = ("function-", "constrained-", "list[", "dict[")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """A one-line message and the parameter name for pydantic's errors (the first one, and how many more)."""
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # pydantic names the union member that failed ("str", "list[int]", "function-after[...]"): not a parameter
    loc = [p for p in loc if p not in ("str", "int", "float", "bool") and not p.startswith(_MEMBER_TAGS)]
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    given = first.get("input")
    if first.get("type", "").startswith(("int_", "greater", "less", "bool_", "string_")) and not isinstance(
        given, dict | list
    ):
        message += f", got {given!r}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    text = f"{param}: {message}" if param else message
    return text + more, param


# -- responses ------------------------------------------------------------------------------------------------


def token_string(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id]) if tokenizer is not None else f"token_id:{token_id}"


def _top_entries(tokenizer, out: Completion) -> list[list[tuple[str, float]]] | None:
    top = out.extra.get("top_logprobs")
    if top is None:
        return None
    return [[(token_string(tokenizer, i), lp) for i, lp in step] for step in top]


def chat_logprobs(tokenizer, out: Completion, top_logprobs: int) -> dict | None:
    if out.logprobs is None:
        return None
    top = _top_entries(tokenizer, out) if top_logprobs else None
    content = []
    for k, (token_id, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        token = token_string(tokenizer, token_id)
        alternatives = [
            {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in (top[k][:top_logprobs] if top else [])
        ]
        content.append({"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(tokenizer, out: Completion, top_logprobs: int) -> dict | None:
    if out.logprobs is None:
        return None
    tokens = [token_string(tokenizer, i) for i in out.token_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top = _top_entries(tokenizer, out) if top_logprobs else None
    return {
        "tokens": tokens,
        "token_logprobs": out.logprobs,
        "top_logprobs": [dict(step[:top_logprobs]) for step in top] if top else None,
        "text_offset": offsets,
    }


def chat_message(out: Completion, tools: bool) -> tuple[dict, str]:
    """The assistant message (tool calls parsed out when tools were offered) and the finish reason."""
    message: dict[str, Any] = {"role": "assistant", "content": out.text}
    finish = out.finish_reason
    parsed = parse_response(out.text)
    if tools and parsed.calls and parsed.error is None:
        calls = [c.to_openai(f"call_{uuid.uuid4().hex[:24]}") for c in parsed.calls]
        message = {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}
        if parsed.thinking is not None:
            message["reasoning_content"] = parsed.thinking
        finish = "tool_calls" if finish == "stop" else finish
    return message, finish


def chat_choice(index: int, out: Completion, tokenizer, tools: bool, logprobs: bool, top_logprobs: int = 0) -> dict:
    message, finish = chat_message(out, tools)
    return {
        "index": index,
        "message": message,
        "finish_reason": finish,
        "logprobs": chat_logprobs(tokenizer, out, top_logprobs) if logprobs else None,
        "text": out.text,
        "token_ids": out.token_ids,
        "prompt_token_ids": out.prompt_token_ids,
    }


def completion_choice(index: int, out: Completion, tokenizer, logprobs: bool, top_logprobs: int = 0) -> dict:
    return {
        "index": index,
        "text": out.text,
        "finish_reason": out.finish_reason,
        "logprobs": completion_logprobs(tokenizer, out, top_logprobs) if logprobs else None,
        "token_ids": out.token_ids,
        "prompt_token_ids": out.prompt_token_ids,
    }


def chat_chunk(index: int, delta: dict) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


def chat_last_chunk(
    index: int, out: Completion, rest: str, tokenizer, tools: bool, logprobs: bool, top_logprobs: int
) -> dict:
    """A choice's last stream chunk: what is left of the text (with tools: the parsed turn), finish reason,
    logprobs, raw text and token ids."""
    message, finish = chat_message(out, tools)
    if tools:
        delta = {k: v for k, v in message.items() if k != "role"}
        for k, call in enumerate(delta.get("tool_calls", [])):
            call["index"] = k
    else:
        delta = {"content": rest} if rest else {}
    return {
        "index": index,
        "delta": delta,
        "logprobs": chat_logprobs(tokenizer, out, top_logprobs) if logprobs else None,
        "finish_reason": finish,
        "text": out.text,
        "token_ids": out.token_ids,
    }


def usage(outs: list[Completion]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class BodyLimit:
    """ASGI wrapper: a request whose declared body exceeds `limit` bytes gets 413 before its body is read."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.limit:
                message = f"the request body has {int(length)} bytes; this server takes at most {self.limit}"
                body = json.dumps(error_body(413, message)).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 413, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
