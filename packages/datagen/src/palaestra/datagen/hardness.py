"""How hard a dataset is in the ways BFCL grades, counted from its messages only (issue 39).

`hardness_figures(rows)` reads each row's ``messages`` (a row of ``samples.jsonl`` or of the export's
``openai.jsonl``: tool-call arguments an object or a JSON string), never the generator's trace records:

- ``parallel_messages`` / ``parallel_calls``: assistant messages with two or more tool calls, and their
  calls; ``parallel_same_function``: those calling one function with different arguments.
- ``calls_per_turn``, ``single_call_share``: over user turns that made calls.
- ``dependent_turns`` of ``multi_turn_turns`` (user turns of samples with two or more): a turn with a call
  whose argument is a value an earlier turn's tool result returned (an id, a name, a figure; a small integer
  for an ``*id`` parameter) that no user message so far states; ``dependent_later_turns`` of ``later_turns``
  (the turns after each sample's first); ``longest_dependent_chain``: the most turns linked so, and
  ``samples_with_chain_3``: samples with a chain of three turns or more.
- ``pasted_descriptions`` of ``user_messages``: user messages that contain a tool's own description (its
  first sentence, as is or as an instruction: `phrasing.short_description`, `phrasing.imperative`).
- ``recovered_errors``: user turns where a tool result is an error response and the assistant calls again
  after it (a flagged error-recovery trajectory, `recovery`; none unless ``p_error_recovery`` is set).
- ``reasoning_sentences`` / ``distinct_reasoning_sentences`` / ``distinct_reasoning_frames``: the sentences
  of ``<think>`` blocks, how many differ, and how many sentence frames (`quality.frame`) they have.
"""

from __future__ import annotations

import json
import re
from typing import Any

from palaestra.datagen.grounding import mentions
from palaestra.datagen.phrasing import imperative, short_description


def _args(call: dict) -> dict:
    a = call["function"]["arguments"]
    return json.loads(a) if isinstance(a, str) else a


def _scalars(x: Any) -> list:
    if isinstance(x, dict):
        return [y for v in x.values() for y in _scalars(v)]
    if isinstance(x, list):
        return [y for v in x for y in _scalars(v)]
    return [x]


def _carried(value: Any, param: str) -> bool:
    """A value a model must carry rather than one a user would type: an id, a name, a figure."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, float) and not value.is_integer():
        return True
    if isinstance(value, int | float):
        return abs(value) >= 100 or "id" in re.findall(r"[a-z]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", param).lower())
    return isinstance(value, str) and len(value) >= 4


def _turns(messages: list[dict]) -> list[dict]:
    """Per user message: its text, its calls, the scalar values its tool results returned."""
    turns: list[dict] = []
    for m in messages:
        if m["role"] == "user":
            turns.append({"text": m.get("content") or "", "calls": [], "returned": []})
        elif not turns:
            continue
        elif m["role"] == "assistant" and m.get("tool_calls"):
            turns[-1]["calls"].append(m["tool_calls"])
        elif m["role"] == "tool":
            try:
                turns[-1]["returned"] += _scalars(json.loads(m["content"]))
            except (json.JSONDecodeError, TypeError):
                continue
    return turns


def _recovered(messages: list[dict]) -> int:
    """User turns with an error tool result that the assistant follows with another call."""
    from palaestra.datagen.envs import is_error_response

    count, failed, counted = 0, False, False
    for m in messages:
        if m["role"] == "user":
            failed = counted = False
        elif m["role"] == "tool":
            try:
                failed = failed or is_error_response(json.loads(m["content"]))
            except (json.JSONDecodeError, TypeError):
                continue
        elif m["role"] == "assistant" and m.get("tool_calls") and failed and not counted:
            count, counted = count + 1, True
    return count


def hardness_figures(rows: list[dict]) -> dict:
    """The figures of the module docstring over `rows`."""
    from palaestra.datagen.envs import get_env
    from palaestra.datagen.quality import frame

    n = dict.fromkeys(
        ["parallel_messages", "parallel_calls", "parallel_same_function", "turns_with_calls", "calls",
         "single_call_turns", "multi_turn_turns", "dependent_turns", "later_turns", "dependent_later_turns",
         "samples_with_chain_3", "longest_dependent_chain", "user_messages", "pasted_descriptions",
         "reasoning_sentences", "recovered_errors"], 0)  # fmt: skip
    sentences: set[str] = set()
    frames: set[str] = set()
    for row in rows:
        env = str((row.get("provenance") or {}).get("env") or row.get("env"))  # a sample's row, or an export's
        docs = get_env(env).docs
        pasted = {f.lower() for d in docs for f in (short_description(d), imperative(d)) if len(f.split()) >= 3}
        messages = row["messages"]
        for m in messages:
            if m["role"] == "assistant":
                for block in re.findall(r"<think>(.*?)</think>", m.get("content") or "", flags=re.S):
                    for sent in re.split(r"(?<=[.!?])\s+", block.strip()):
                        if sent:
                            n["reasoning_sentences"] += 1
                            sentences.add(sent)
                            frames.add(frame(sent))
                calls = m.get("tool_calls") or []
                if len(calls) >= 2:
                    n["parallel_messages"] += 1
                    n["parallel_calls"] += len(calls)
                    n["parallel_same_function"] += len({c["function"]["name"] for c in calls}) == 1
            if m["role"] == "user":
                n["user_messages"] += 1
                n["pasted_descriptions"] += any(p in (m.get("content") or "").lower() for p in pasted)
        n["recovered_errors"] += _recovered(messages)
        turns = _turns(messages)
        depth = [1] * len(turns)
        for t, turn in enumerate(turns):
            k = sum(len(c) for c in turn["calls"])
            if k:
                n["turns_with_calls"] += 1
                n["calls"] += k
                n["single_call_turns"] += k == 1
            said = "\n".join(x["text"] for x in turns[: t + 1])
            sources = [
                j
                for j in range(t)
                for c in turn["calls"]
                for call in c
                for param, value in _args(call).items()
                for v in _scalars(value)
                if _carried(v, param) and v in turns[j]["returned"] and not mentions(v, said)
            ]
            if sources:
                depth[t] = 1 + max(depth[j] for j in set(sources))
            if len(turns) > 1:
                n["multi_turn_turns"] += 1
                n["dependent_turns"] += bool(sources)
                n["later_turns"] += t > 0
                n["dependent_later_turns"] += bool(sources) and t > 0
        chain = max(depth, default=1) if any(d > 1 for d in depth) else 0
        n["longest_dependent_chain"] = max(n["longest_dependent_chain"], chain)
        n["samples_with_chain_3"] += chain >= 3
    return {
        **n,
        "calls_per_turn": n["calls"] / n["turns_with_calls"] if n["turns_with_calls"] else 0.0,
        "single_call_share": n["single_call_turns"] / n["turns_with_calls"] if n["turns_with_calls"] else 0.0,
        "dependent_share": n["dependent_turns"] / n["multi_turn_turns"] if n["multi_turn_turns"] else 0.0,
        "dependent_later_share": n["dependent_later_turns"] / n["later_turns"] if n["later_turns"] else 0.0,
        "pasted_share": n["pasted_descriptions"] / n["user_messages"] if n["user_messages"] else 0.0,
        "distinct_reasoning_sentences": len(sentences),
        "distinct_reasoning_frames": len(frames),
    }
