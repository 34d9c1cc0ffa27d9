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

from palaestra.datagen.grounding import param_words
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
            pspec = props.get(param, {})
            if "default" in pspec and (pspec["default"] == value or (pspec["default"] == "None" and value is None)):
                continue  # a documented default: nothing the user has to say
            key = param
            n = 2
            while key in inputs and inputs[key]["value"] != value:
                key = f"{param}_{n}"
                n += 1
            if key in inputs:
                continue
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
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(_value_text(v) for v in value) if value else "nothing"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {_value_text(v)}" for k, v in value.items())
    return repr(value)


def _words(name: str) -> str:
    return re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").lower()


def _detail(param: str, value: Any) -> str:
    words = _words(param)
    return f"{words}: {_value_text(value)}" if isinstance(value, bool) else f"{words} {_value_text(value)}"


def goal_phrase(spec, step_name: str) -> str:
    text = short_description(spec.doc(step_name))
    return text[0].lower() + text[1:]


OPENERS = ["Could you {g}?", "I'd like you to {g}.", "Please {g}.", "I need you to {g}.", "Can you help me {g}?"]
JOINERS = [", and then ", "; after that, ", ", and once that is done, ", " and also "]
CONTEXT = ["For reference: {d}.", "In case you need it, {d}.", "Details you may need: {d}."]


class DeterministicQueryWriter:
    """States the user's goals (the visible steps) with the values the user knows; hidden steps stay unsaid.

    Phrasing varies by the sample's rng: several openers, joiners and ways to
    give the values that no visible step takes directly (the inputs of hidden
    steps, e.g. credentials for a login that the goal needs).
    """

    name = "deterministic"

    def write(self, tool: AdvancedTool, trace: Trace, spec, rng: random.Random, omit: list[str] = ()) -> Query | None:
        visible = [i for i in range(len(trace.steps)) if i not in trace.hidden]
        by_step: dict[int, list[str]] = {}
        for key, v in tool.inputs.items():
            if key not in omit:
                by_step.setdefault(v["step"], []).append(_detail(v["param"], v["value"]))
        goals = []
        for i in visible:
            step = trace.steps[i]
            details = by_step.pop(i, [])
            for param, src in step.feeds.items():  # say what the value is, not how to get it
                key = step.feed_keys.get(param, param)
                inner = by_step.pop(src, [])
                how = goal_phrase(spec, trace.steps[src].name) + (" with " + ", ".join(inner) if inner else "")
                sel = step.selectors.get(param)
                which = f" of the one with the {sel[1]} {_words(sel[0])} among those" if sel else ""
                details.append(f"{_words(param)}: the {_words(key)}{which} you get when you {how}")
            g = goal_phrase(spec, step.name)
            goals.append(g + (" (" + "; ".join(details) + ")" if details else ""))
        joiner = rng.choice(JOINERS)
        text = rng.choice(OPENERS).format(g=joiner.join(goals))
        rest = [d for i in sorted(by_step) for d in by_step[i]]
        if rest:
            text += " " + rng.choice(CONTEXT).format(d=", ".join(rest))
        if rng.random() < 0.5:
            text += " " + rng.choice(NOISE)
        return Query(text, list(omit))


class DeterministicReasoner:
    """Follows the ground-truth trace and says why each call comes now; may skip hidden steps on the first try."""

    name = "deterministic"

    def __init__(self, naive_first_try: float = 0.3):
        self.naive_first_try = naive_first_try

    def act(self, messages: list[dict], tools: list[dict], turn, try_index: int, rng: random.Random) -> str:
        spec_doc = {t["function"]["name"]: t["function"] for t in tools}
        if turn.kind == "miss_param":
            what = param_words(turn.missing or "information")
            text = f"I can do that, but I need the {what} first. Could you tell me the {what}?"
            thinking = f"The request needs the {what}, and neither the request nor any earlier result gives it."
            return format_calls([], thinking=thinking, content=text)
        if turn.kind == "miss_func":
            text = f"None of the available functions can {turn.missing}, so I cannot do this right now."
            thinking = f"The request needs a function that can {turn.missing}; no listed function does that."
            return format_calls([], thinking=thinking, content=text)
        done = _tool_results_since_user(messages)
        steps = turn.trace.steps
        plan = list(range(len(steps)))
        if try_index == 0 and turn.trace.hidden and rng.random() < self.naive_first_try:
            plan = [i for i in plan if i not in turn.trace.hidden]
        if done >= len(plan):
            return format_calls([], thinking="Every step the request needs is done.", content="Done: " + turn.summary())
        i = plan[done]
        step = steps[i]
        why = []
        consumers = [(j, p) for j, s in enumerate(steps) for p, src in s.feeds.items() if src == i and j in plan]
        for j, param in consumers:
            key = steps[j].feed_keys.get(param, param)
            why.append(
                f"{steps[j].name} needs the {_words(param)}, which is the {_words(key)} that {step.name} returns"
            )
        for param, src in step.feeds.items():
            sel = step.selectors.get(param)
            which = f" of the record with the {sel[1]} {_words(sel[0])}" if sel else ""
            key = _words(step.feed_keys.get(param, param))
            why.append(f"the {_words(param)} is the {key}{which} from {steps[src].name}")
        given = [p for p in step.arguments if p not in step.feeds]
        if given and not consumers:
            why.append(f"the request gives the {', '.join(_words(p) for p in given)}")
        desc = spec_doc.get(step.name, {}).get("description", "")
        lead = f"Next: {step.name}" + (f" ({desc.split('Tool description:')[-1].strip().rstrip('.')})" if desc else "")
        return format_calls(
            [ToolCall(step.name, step.arguments)], thinking=f"{lead}." + (f" {'; '.join(why)}." if why else "")
        )


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
