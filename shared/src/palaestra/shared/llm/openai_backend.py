"""The `openai` backend: any OpenAI-compatible endpoint (``palaestra serve``, vLLM, SGLang, hosted APIs).

- `generate` sends one ``/v1/completions`` request per call (prompts as text or
  token ids; the server batches them);
- `chat` sends one ``/v1/chat/completions`` request per conversation, several
  in flight at once (servers batch concurrent requests);
- retries with exponential backoff are the ``openai`` package's own
  (``max_retries``: connection errors, 408/409/429/5xx); what still fails
  becomes a one-line `LLMError` naming the URL;
- token ids: requested with ``return_token_ids`` (vLLM's flag; ``palaestra
  serve`` always sends them) and read from each choice's ``token_ids`` /
  ``prompt_token_ids``; servers that do not send them leave ``token_ids`` empty
  and ``extra["token_ids_missing"]`` set (a server that rejects the flag is
  asked again without it). Logprobs come from the standard ``logprobs`` fields.
- chat text: the raw generated text when the server sends it (``text`` in a
  ``palaestra serve`` choice), else rebuilt from the message in the project's
  format (`toolcall.format_calls`: thinking, tool calls, content).

`render` (and token-id prompts for `chat`-free rollouts) needs a local tokenizer:
it is loaded on first use when ``model`` names an embedded model or a local
directory.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from palaestra.shared.extras import require
from palaestra.shared.llm.base import Completion, LLMClient, LLMConfig, LLMError, SamplingParams, is_per_conversation
from palaestra.shared.toolcall import ToolCall, format_calls


class OpenAIClient(LLMClient):
    """`LLMClient` over an OpenAI-compatible HTTP endpoint."""

    max_concurrency = 32
    """Chat requests in flight at once."""

    def __init__(self, config: LLMConfig) -> None:
        openai = require("openai", "openai", "the openai LLM backend")
        self.config = config
        self.base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        self._openai = openai
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=config.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            max_retries=config.max_retries,
            timeout=config.timeout_s,
        )
        self._tokenizer = None
        self._ask_token_ids = True

    @property
    def tokenizer(self):  # type: ignore[override]
        """The model's tokenizer, loaded locally on first use (embedded model or local directory only)."""
        if self._tokenizer is None:
            from palaestra.shared.llm.models import load_tokenizer, resolve_model_path

            try:
                path = resolve_model_path(self.config.model, seed=self.config.seed)
            except LLMError:
                raise LLMError(
                    f"no local tokenizer for served model '{self.config.model}': use chat(), or serve an embedded "
                    "model or a local directory"
                ) from None
            self._tokenizer = load_tokenizer(self.config.model, path)
        return self._tokenizer

    # -- requests ---------------------------------------------------------------------------------------------

    def _call(self, fn, **kwargs) -> Any:
        """One API call; the package retries with backoff, what still fails is a one-line LLMError."""
        try:
            try:
                return fn(**kwargs)
            except self._openai.BadRequestError as err:
                # hosted APIs refuse vLLM's extra flag: drop it for this client and ask again
                if "return_token_ids" not in str(err) or not self._ask_token_ids:
                    raise
                self._ask_token_ids = False
                kwargs.pop("extra_body", None)
                return fn(**kwargs)
        except self._openai.APITimeoutError:
            raise LLMError(f"{self.base_url} did not answer within {self.config.timeout_s:.0f} s") from None
        except self._openai.APIConnectionError as err:
            raise LLMError(f"cannot reach the OpenAI-compatible server at {self.base_url} ({err})") from None
        except self._openai.APIStatusError as err:
            body = err.body if isinstance(err.body, dict) else {}
            message = str(body.get("message") or err.message or "").splitlines()[0]
            raise LLMError(f"{self.base_url} answered {err.status_code}: {message}") from None

    def _sampling(self, params: SamplingParams) -> dict:
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "n": params.n,
        }
        extra: dict[str, Any] = {}
        if self._ask_token_ids:
            extra["return_token_ids"] = True
        if params.top_k > 0:  # not an OpenAI field: vLLM's (and palaestra serve's) extra body field
            extra["top_k"] = params.top_k
        if extra:
            kwargs["extra_body"] = extra
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        return kwargs

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams | None = None) -> list[Completion]:
        params = params or SamplingParams()
        if not prompts:
            return []
        prompt_list = [list(map(int, p)) if not isinstance(p, str) else p for p in prompts]
        kwargs = self._sampling(params)
        if params.logprobs:
            kwargs["logprobs"] = 0
        response = self._call(self.client.completions.create, prompt=prompt_list, **kwargs)
        choices = sorted(response.choices, key=lambda c: c.index)
        if len(choices) != len(prompts) * params.n:
            raise LLMError(f"{self.base_url} returned {len(choices)} choices for {len(prompts)} prompts x n={params.n}")
        out = []
        for k, choice in enumerate(choices):
            extra = choice.model_extra or {}
            prompt = prompt_list[k // params.n]
            logprobs = list(choice.logprobs.token_logprobs) if params.logprobs and choice.logprobs else None
            prompt_ids = extra.get("prompt_token_ids") or (prompt if not isinstance(prompt, str) else [])
            token_ids = extra.get("token_ids")
            out.append(self._completion(choice.text, token_ids, logprobs, prompt_ids, choice.finish_reason))
        return out

    def chat(
        self,
        conversations: list[list[dict]],
        params: SamplingParams | None = None,
        tools: list[dict] | list[list[dict]] | None = None,
    ) -> list[Completion]:
        params = params or SamplingParams()
        per_conv = is_per_conversation(tools)

        def one(i: int) -> list[Completion]:
            kwargs = self._sampling(params)
            conv_tools = tools[i] if per_conv and tools is not None else tools
            if conv_tools:
                kwargs["tools"] = conv_tools
            if params.logprobs:
                kwargs["logprobs"] = True
            response = self._call(self.client.chat.completions.create, messages=conversations[i], **kwargs)
            prompt_ids = (response.model_extra or {}).get("prompt_token_ids") or []
            choices = sorted(response.choices, key=lambda c: c.index)
            return [self._chat_completion(c, prompt_ids, params) for c in choices]

        if len(conversations) <= 1:
            results = [one(i) for i in range(len(conversations))]
        else:
            with ThreadPoolExecutor(min(self.max_concurrency, len(conversations))) as pool:
                results = list(pool.map(one, range(len(conversations))))
        return [c for group in results for c in group]

    def _chat_completion(self, choice, prompt_ids: list[int], params: SamplingParams) -> Completion:
        extra = choice.model_extra or {}
        message = choice.message
        text = extra.get("text")
        if text is None:  # a server that parsed the turn: rebuild it in the project's format
            calls = [ToolCall(c.function.name, _arguments(c.function.arguments)) for c in (message.tool_calls or [])]
            thinking = (message.model_extra or {}).get("reasoning_content")
            text = format_calls(calls, thinking, message.content or "") if calls or thinking else message.content or ""
        logprobs = None
        if params.logprobs and choice.logprobs and choice.logprobs.content is not None:
            logprobs = [t.logprob for t in choice.logprobs.content]
        finish = "stop" if choice.finish_reason == "tool_calls" else choice.finish_reason
        prompt_ids = extra.get("prompt_token_ids") or prompt_ids
        return self._completion(text, extra.get("token_ids"), logprobs, prompt_ids, finish)

    @staticmethod
    def _completion(text, token_ids, logprobs, prompt_ids, finish) -> Completion:
        completion = Completion(text or "", list(token_ids or []), logprobs, list(prompt_ids or []), finish or "stop")
        if token_ids is None:
            completion.extra["token_ids_missing"] = True
        return completion

    def close(self) -> None:
        self.client.close()


def _arguments(raw: str) -> dict:
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        return {"__raw__": raw}
    return value if isinstance(value, dict) else {"__raw__": value}
