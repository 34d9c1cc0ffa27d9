"""Prompt tokens of a multi-turn conversation under any chat template, without re-rendering what the model wrote.

An agent's first prompt is its messages rendered through the chat template. A later prompt is the previous
prompt + the response as generated + the template's *tail*: what the template renders after an assistant
turn's content when `messages` follow it, through the next generation prompt (e.g. Qwen's
``<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n``).

The tail comes from the template alone. Two renders of ``[user, assistant, *messages]`` that differ only in
the assistant's content (one token, ``y`` or ``z``) agree before and after it; what follows the content is the
tail. Nothing is assumed about the tokenizer's ``eos_token``: Phi-3's template ends a render without a
generation prompt with ``eos_token``, Gemma ends a turn with ``<end_of_turn>``, GLM-4 with the next role's
token, and the renders above see each as it is.

The turn's end ids are the tail's first token plus the client's end ids (the generation config's
``eos_token_id`` list): a response that stopped on the tail's first token is not given it twice. A response
that stopped on another end id than the one the template would put there (gpt-oss's ``<|return|>`` where an
earlier turn re-renders with ``<|end|>``; GLM-4's ``<|user|>`` where a tool result follows as
``<|observation|>``) keeps its token (the context is what the model generated) and gets the rest of the tail;
``rollout.context=template`` re-renders the conversation instead (rollout/engine.py).
"""

from __future__ import annotations

from enum import StrEnum

from palaestra.shared.llm.base import LLMClient


class ContextView(StrEnum):
    """What a later turn's prompt holds (``rollout.context``)."""

    generated = "generated"
    """The exact tokens the model was sampled on: earlier prompts and responses verbatim, plus the template's
    tail (`ChatTokens.extend`). The training sequence is one conversation, its reasoning kept."""
    template = "template"
    """The conversation re-rendered as the model's own template does (earlier responses as text; Qwen3 drops
    their ``<think>``): the view a chat endpoint shows. A later prompt need not extend the earlier ones, so
    training takes a row per run of turns that do (`Trajectory.to_sequences`)."""


class ChatTokens:
    """Prompt ids through a client's chat template; later turns as the template's tail (never re-rendering)."""

    _USER = [{"role": "user", "content": "x"}]
    _PROBES = ("y", "z")

    def __init__(self, client: LLMClient):
        self.client = client
        tokenizer = client.tokenizer
        self.probe_ids = [tokenizer.encode(p, add_special_tokens=False) for p in self._PROBES]
        if any(len(ids) != 1 for ids in self.probe_ids) or self.probe_ids[0] == self.probe_ids[1]:
            raise ValueError("the tokenizer does not encode 'y' and 'z' as two single tokens")
        try:
            tail = self.tail([{"role": "user", "content": "next"}])
        except ValueError:
            raise
        except Exception as err:  # e.g. a vision-language template that wants content as a list of parts
            raise ValueError(
                f"the chat template cannot render plain-text messages: {type(err).__name__}: {err}"
            ) from err
        if not tail:
            raise ValueError("the chat template renders nothing after an assistant turn followed by a user message")
        self.turn_end = tail[0]
        """The first token the template puts after an assistant turn's content (e.g. ``<|im_end|>``)."""
        client_ends = getattr(client, "eos_token_ids", None) or [tokenizer.eos_token_id]
        self.end_ids = {self.turn_end, *(t for t in client_ends if t is not None)}
        """Token ids that end an assistant turn: the template's, and the ones the client stops on."""

    def first(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.client.render(messages, tools, add_generation_prompt=True)

    def tail(self, messages: list[dict]) -> list[int]:
        """What the template renders after an assistant turn's content when `messages` follow it, through the
        next generation prompt."""
        renders = []
        for probe in self._PROBES:
            conversation = [*self._USER, {"role": "assistant", "content": probe}, *messages]
            renders.append(self.client.render(conversation, add_generation_prompt=True))
        a, b = renders
        start = next((i for i, (s, t) in enumerate(zip(a, b)) if s != t), None)
        if start is None or len(a) != len(b) or a[start + 1 :] != b[start + 1 :]:
            raise ValueError("the chat template renders an assistant turn's content other than verbatim")
        if a[start] != self.probe_ids[0][0] or b[start] != self.probe_ids[1][0]:
            raise ValueError("the chat template renders an assistant turn's content other than verbatim")
        return a[start + 1 :]

    def extend(self, prompt: list[int], response: list[int], messages: list[dict]) -> list[int]:
        """The next prompt: `prompt` + `response` verbatim + the template's tail (without the end token the
        response already stopped on)."""
        tail = self.tail(messages)
        if response and response[-1] in self.end_ids and tail and tail[0] in self.end_ids:
            tail = tail[1:]  # the response's own end token stands where the template's would
        return prompt + response + tail
