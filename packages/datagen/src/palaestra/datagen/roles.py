"""The four agent roles of the pipeline, deterministic implementations.

- tool maker A_T(trace) -> `AdvancedTool`: one composite schema for a whole
  trace; its inputs are the argument values no earlier step produced (the
  intermediate values stay hidden);
- query writer A_Q(T_adv, noise) -> the user's request;
- reasoner A_R: answers a turn step by step (chain of thought + calls);
- critic A_C: a hint after a failed try that does not reveal the answer.

The deterministic ones are built from schemas and the trace: they work
offline and are the baseline. The deterministic reasoner follows the trace
(it is an oracle), except that on its first try it may skip the hidden
steps (``naive_first_try``), which exercises the critic loop the way a weak
reasoner would. LLM implementations live in `llm_roles`; `make_roles` picks
one per role from config.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from palaestra.datagen.sampler import Trace
from palaestra.datagen.schema import parameters, to_openai_tool
from palaestra.shared.toolcall import ToolCall, format_calls

NOISE = [
    "I'm in a bit of a rush today.",
    "Thanks a lot in advance!",
    "This came up during our weekly sync.",
    "No need for a long explanation.",
    "My colleague asked me to handle this.",
]


def short_description(doc: dict) -> str:
    """The tool-specific sentence of a BFCL description (after 'Tool description:')."""
    text = doc.get("description", "")
    text = text.split("Tool description:", 1)[-1].strip()
    return text.split(". ")[0].rstrip(".") or doc["name"]


@dataclass
class AdvancedTool:
    name: str
    description: str
    inputs: dict[str, dict]
    """Parameter name -> ``{"type", "description", "value", "step", "param"}`` (value: the trace's)."""
    output: list[str]

    def schema(self) -> dict:
        props = {k: {"type": v["type"], "description": v["description"]} for k, v in self.inputs.items()}
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
            "response": {"type": "object", "properties": {k: {"type": "string"} for k in self.output}},
        }


@dataclass
class Query:
    text: str
    omitted: list[str] = field(default_factory=list)
    """Inputs left out on purpose (a miss_param turn)."""


def free_inputs(trace: Trace, spec) -> dict[str, dict]:
    """Arguments that no earlier step produced: what the user has to say."""
    inputs: dict[str, dict] = {}
    for i, step in enumerate(trace.steps):
        props = parameters(spec.doc(step.name))
        for param, value in step.arguments.items():
            if param in step.feeds:
                continue
            key = param
            n = 2
            while key in inputs and inputs[key]["value"] != value:
                key = f"{param}_{n}"
                n += 1
            if key in inputs:
                continue
            pspec = props.get(param, {})
            inputs[key] = {
                "type": pspec.get("type", "string"),
                "description": pspec.get("description", ""),
                "value": value,
                "step": i,
                "param": param,
            }
    return inputs


class DeterministicToolMaker:
    name = "deterministic"

    def make(self, trace: Trace, spec, rng: random.Random) -> AdvancedTool | None:
        steps = " then ".join(short_description(spec.doc(s.name)).lower() for s in trace.steps)
        last = trace.steps[-1]
        out = [k for k in (spec.doc(last.name).get("response") or {}).get("properties", {})]
        return AdvancedTool(f"{trace.target}_adv", f"Composite operation: {steps}.", free_inputs(trace, spec), out)


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value) if value else "nothing"
    return repr(value)


class DeterministicQueryWriter:
    name = "deterministic"

    def write(self, tool: AdvancedTool, trace: Trace, spec, rng: random.Random, omit: list[str] = ()) -> Query | None:
        visible = [i for i in range(len(trace.steps)) if i not in trace.hidden]
        goals = [short_description(spec.doc(trace.steps[i].name)) for i in visible]
        goal = "; then ".join(g[0].lower() + g[1:] for g in goals)
        details = [f"{k.replace('_', ' ')} {_value_text(v['value'])}" for k, v in tool.inputs.items() if k not in omit]
        text = f"Please {goal}."
        if details:
            text += " Use " + ", ".join(details) + "."
        text += " " + rng.choice(NOISE)
        return Query(text, list(omit))


class DeterministicReasoner:
    """Follows the ground-truth trace; may skip hidden steps on the first try."""

    name = "deterministic"

    def __init__(self, naive_first_try: float = 0.3):
        self.naive_first_try = naive_first_try

    def act(self, messages: list[dict], tools: list[dict], turn, try_index: int, rng: random.Random) -> str:
        if turn.kind in ("miss_param", "miss_func"):
            what = turn.missing or "information"
            text = (
                f"I need the {what.replace('_', ' ')} to do this; could you tell me?"
                if turn.kind == "miss_param"
                else f"None of the available functions can {what}; I cannot do that right now."
            )
            return format_calls([], thinking=f"The request cannot be completed as asked: {turn.kind}.", content=text)
        done = _tool_results_since_user(messages)
        plan = list(range(len(turn.trace.steps)))
        if try_index == 0 and turn.trace.hidden and rng.random() < self.naive_first_try:
            plan = [i for i in plan if i not in turn.trace.hidden]
        if done >= len(plan):
            return format_calls([], thinking="All steps are done.", content="Done: " + turn.summary())
        step = turn.trace.steps[plan[done]]
        why = f"Step {done + 1} of {len(plan)}: call {step.name}"
        if step.feeds:
            why += " with " + ", ".join(f"{p} from step {i + 1}'s result" for p, i in step.feeds.items())
        return format_calls([ToolCall(step.name, step.arguments)], thinking=why + ".")


def _tool_results_since_user(messages: list[dict]) -> int:
    n = 0
    for m in reversed(messages):
        if m["role"] in ("user", "system"):
            break
        if m["role"] == "tool":
            n += 1
    return n


class DeterministicCritic:
    """Names what kind of step is missing or wrong, never a call or a value."""

    name = "deterministic"

    def critique(self, turn, attempt_calls: list[ToolCall], failure: dict, rng: random.Random) -> str:
        missing = failure.get("missing_tools", [])
        if not attempt_calls:
            return "Your answer made no tool call; this request needs the tools."
        if missing:
            return (
                f"Your answer left out {len(missing)} needed step(s); some values the final call needs must be "
                "looked up with another tool first. Check which inputs you have not obtained yet."
            )
        if failure.get("state_mismatch"):
            return "Your calls changed the environment differently than the request asks; re-read the request."
        return "Some results the request depends on were not produced; re-check each step's arguments."


def openai_tools(spec, exclude: set[str] = frozenset()) -> list[dict]:
    return [to_openai_tool(d) for d in spec.docs if d["name"] not in exclude]


@dataclass
class Roles:
    tool_maker: Any
    query_writer: Any
    reasoner: Any
    critic: Any

    def names(self) -> dict[str, str]:
        return {k: getattr(self, k).name for k in ("tool_maker", "query_writer", "reasoner", "critic")}


def redact(text: str, values: list[Any], calls: list[str]) -> str:
    """Remove ground-truth calls and argument values from a hint."""
    for call in calls:
        text = text.replace(call, "<call>")
    strings = sorted({str(v) for v in _flatten(values) if len(str(v)) >= 2}, key=len, reverse=True)
    for s in strings:
        text = re.sub(rf"(?<![A-Za-z0-9_]){re.escape(s)}(?![A-Za-z0-9_])", "<value>", text, flags=re.IGNORECASE)
    return text


def _flatten(values: list[Any]) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, list | tuple):
            out += _flatten(list(v))
        elif isinstance(v, dict):
            out += _flatten(list(v.values())) + list(v.keys())
        else:
            out.append(v)
            if isinstance(v, float) and v.is_integer():
                out.append(int(v))
    return out
