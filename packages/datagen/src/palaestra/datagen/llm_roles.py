"""LLM implementations of the four roles, through any `LLMClient`, with prompts in ``prompts/*.txt``.

Every role survives junk: an unparseable or empty answer makes the role
return None (the tool maker, the query writer) or an empty hint (the critic),
or a turn without calls (the reasoner); the pipeline counts it as a drop
with its reason. `CountingClient` counts LLM calls so that the stats report
LLM calls per kept sample.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from string import Template

from palaestra.datagen.roles import AdvancedTool, DeterministicToolMaker, Query, _value_text
from palaestra.shared.llm.base import LLMClient, LLMError, SamplingParams

PROMPTS = Path(__file__).parent / "prompts"


def prompt(name: str, **values) -> str:
    return Template((PROMPTS / f"{name}.txt").read_text()).safe_substitute(**values)


class CountingClient:
    """Wraps an `LLMClient`; counts chat calls; an LLM error becomes an empty completion (a counted drop)."""

    def __init__(self, client: LLMClient, params: SamplingParams):
        self.client = client
        self.params = params
        self.calls = 0
        self.errors = 0

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        self.calls += 1
        try:
            out = self.client.chat([messages], self.params, tools=tools)
            return (out[0].text if out else "") or ""
        except (LLMError, ValueError, RuntimeError):
            self.errors += 1
            return ""


class LLMToolMaker:
    name = "llm"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.fallback = DeterministicToolMaker()

    def make(self, trace, spec, rng: random.Random) -> AdvancedTool | None:
        base = self.fallback.make(trace, spec, rng)
        calls = "\n".join(
            f"{i + 1}. {s.call} -> {json.dumps(s.output, default=str)[:300]}" for i, s in enumerate(trace.steps)
        )
        text = self.llm.chat(
            [{"role": "user", "content": prompt("tool_maker", calls=calls, inputs=", ".join(base.inputs) or "none")}]
        )
        match = re.search(r"\{.*\}", text, re.DOTALL)
        try:
            obj = json.loads(match.group(0)) if match else None
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            return None
        name, description = obj.get("name"), obj.get("description")
        if not (
            isinstance(name, str)
            and re.fullmatch(r"[A-Za-z_]\w{0,63}", name)
            and isinstance(description, str)
            and 10 <= len(description) <= 600
        ):
            return None
        return AdvancedTool(name, description.strip(), base.inputs, base.output)


class LLMQueryWriter:
    name = "llm"

    def __init__(self, llm: CountingClient):
        self.llm = llm

    def write(self, tool: AdvancedTool, trace, spec, rng: random.Random, omit: list[str] = ()) -> Query | None:
        from palaestra.datagen.roles import NOISE

        values = {k: v["value"] for k, v in tool.inputs.items() if k not in omit}
        text = self.llm.chat(
            [
                {
                    "role": "user",
                    "content": prompt(
                        "query_writer",
                        description=tool.description,
                        noise=rng.choice(NOISE),
                        values="; ".join(f"{k.replace('_', ' ')} = {_value_text(v)}" for k, v in values.items())
                        or "none",
                    ),
                }
            ]
        )
        text = text.split("</think>")[-1].strip()
        if not (10 <= len(text) <= 2000):
            return None
        # the request must carry every value the user knows, or the task is unsolvable
        lowered = text.lower()
        for v in values.values():
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, str) and item.lower() not in lowered:
                    return None
        return Query(text, list(omit))


class LLMReasoner:
    name = "llm"

    def __init__(self, llm: CountingClient):
        self.llm = llm

    def act(self, messages, tools, turn, try_index, rng) -> str:
        system = {"role": "system", "content": prompt("reasoner_system")}
        return self.llm.chat([system, *messages], tools=tools)


class LLMCritic:
    name = "llm"

    def __init__(self, llm: CountingClient):
        self.llm = llm

    def critique(self, turn, attempt_calls, failure, rng) -> str:
        calls = ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in attempt_calls) or "none"
        summary = (
            f"{len(failure.get('missing_tools', []))} expected result(s) missing; "
            f"state {'differs' if failure.get('state_mismatch') else 'matches'}"
        )
        text = self.llm.chat(
            [{"role": "user", "content": prompt("critic", query=turn.query, calls=calls, failure=summary)}]
        )
        return text.split("</think>")[-1].strip()[:600]
