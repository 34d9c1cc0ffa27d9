"""LLM implementations of the four roles, through any `LLMClient`, with prompts in ``prompts/*.txt``.

Each role parses its model's answer robustly (a ``<think>`` block, code
fences, a preamble such as "Here is the request:", surrounding quotes are
taken off) and checks it; an answer that fails makes the role return None
(tool maker, query writer) or an empty hint (critic), with the reason in
``last_drop`` and counted per role in `CountingClient.drops`
(``"query_writer:missing_value"``, ``"tool_maker:no_json"``, ...); the
pipeline drops the sample under that reason. The reasoner's failures are the
guided chain's (``unverified:<why>``). Checks per role:

- tool maker: a JSON object with a snake_case ``name`` and a 10-600 character ``description``;
- query writer: 10-2000 characters, every value the user knows stated
  (`grounding.stated`: the same test the verifier applies), no tool name;
- critic: the text after ``</think>``, at most 600 characters (the chain
  redacts any call or value it leaks).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from string import Template

from palaestra.datagen.grounding import stated
from palaestra.datagen.phrasing import NOISE, param_phrase, value_text
from palaestra.datagen.roles import AdvancedTool, DeterministicToolMaker, Query
from palaestra.shared.llm.base import LLMClient, LLMError, SamplingParams

PROMPTS = Path(__file__).parent / "prompts"
PREAMBLE_RE = re.compile(r"^\s*(?:here(?:'s| is)[^:\n]*|sure[^:\n]*|request|user(?:'s)? request|query)\s*:\s*", re.I)


def prompt(name: str, **values) -> str:
    return Template((PROMPTS / f"{name}.txt").read_text()).safe_substitute(**values)


def answer_text(text: str) -> str:
    """The answer proper: after ``</think>``, without code fences, a preamble line or surrounding quotes."""
    text = text.split("</think>")[-1].strip()
    text = re.sub(r"^```[a-zA-Z]*\n?|\n?```$", "", text).strip()
    text = PREAMBLE_RE.sub("", text, count=1).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def first_json_object(text: str) -> dict | None:
    """The first balanced ``{...}`` in `text` that parses as a JSON object."""
    text = text.split("</think>")[-1]
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        depth = 0
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                try:
                    obj = json.loads(text[start : end + 1])
                except json.JSONDecodeError:
                    break
                return obj if isinstance(obj, dict) else None
    return None


class CountingClient:
    """Wraps an `LLMClient`; counts chat calls and drops per role; an LLM error becomes an empty completion."""

    def __init__(self, client: LLMClient, params: SamplingParams):
        self.client = client
        self.params = params
        self.calls = 0
        self.errors = 0
        self.drops: dict[str, int] = {}

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        self.calls += 1
        try:
            out = self.client.chat([messages], self.params, tools=tools)
            return (out[0].text if out else "") or ""
        except (LLMError, ValueError, RuntimeError):
            self.errors += 1
            return ""

    def drop(self, role, reason: str) -> None:
        role.last_drop = reason
        key = f"{role.role}:{reason}"
        self.drops[key] = self.drops.get(key, 0) + 1


class LLMToolMaker:
    name = "llm"
    role = "tool_maker"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.fallback = DeterministicToolMaker()
        self.last_drop: str | None = None

    def make(self, trace, spec, rng: random.Random) -> AdvancedTool | None:
        base = self.fallback.make(trace, spec, rng)
        calls = "\n".join(
            f"{i + 1}. {s.call} -> {json.dumps(s.output, default=str)[:300]}" for i, s in enumerate(trace.steps)
        )
        text = self.llm.chat(
            [{"role": "user", "content": prompt("tool_maker", calls=calls, inputs=", ".join(base.inputs) or "none")}]
        )
        obj = first_json_object(text)
        if obj is None:
            return self.llm.drop(self, "no_json")
        name, description = obj.get("name"), obj.get("description")
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w{0,63}", name)):
            return self.llm.drop(self, "bad_name")
        if not (isinstance(description, str) and 10 <= len(description.strip()) <= 600):
            return self.llm.drop(self, "bad_description")
        return AdvancedTool(name, description.strip(), base.inputs, base.output)


class LLMQueryWriter:
    name = "llm"
    role = "query_writer"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.last_drop: str | None = None

    def write(self, tool: AdvancedTool, trace, spec, rng: random.Random, omit: list[str] = ()) -> Query | None:
        values = {k: v for k, v in tool.inputs.items() if k not in omit}
        text = self.llm.chat(
            [
                {
                    "role": "user",
                    "content": prompt(
                        "query_writer",
                        description=tool.description,
                        noise=rng.choice(NOISE),
                        values="; ".join(
                            f"{param_phrase(v['param'])} {value_text(v['value'])}" for v in values.values()
                        )
                        or "none",
                    ),
                }
            ]
        )
        text = answer_text(text)
        if not (10 <= len(text) <= 2000):
            return self.llm.drop(self, "length")
        # the request must carry every value the user knows (the verifier's own test), or the task is unsolvable
        if not all(stated(v["value"], text, v["param"]) for v in values.values()):
            return self.llm.drop(self, "missing_value")
        if any(re.search(rf"\b{re.escape(name)}\b", text) for name in spec.tool_names if "_" in name or len(name) > 6):
            return self.llm.drop(self, "names_tool")
        return Query(text, list(omit))


class LLMReasoner:
    name = "llm"
    role = "reasoner"

    def __init__(self, llm: CountingClient):
        self.llm = llm

    def act(self, messages, tools, turn, try_index, rng) -> str:
        system = {"role": "system", "content": prompt("reasoner_system")}
        return self.llm.chat([system, *messages], tools=tools)


class LLMCritic:
    name = "llm"
    role = "critic"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.last_drop: str | None = None

    def critique(self, turn, attempt_calls, failure, rng) -> str:
        calls = ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in attempt_calls) or "none"
        summary = (
            f"{len(failure.get('missing_tools', []))} expected result(s) missing; "
            f"state {'differs' if failure.get('state_mismatch') else 'matches'}"
        )
        text = self.llm.chat(
            [{"role": "user", "content": prompt("critic", query=turn.query, calls=calls, failure=summary)}]
        )
        hint = answer_text(text)[:600]
        if not hint:
            self.llm.drop(self, "empty")
        return hint
