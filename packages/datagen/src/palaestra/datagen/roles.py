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

import json
import random
import re
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from palaestra.datagen import phrasing as P
from palaestra.datagen.envs import is_error_response
from palaestra.datagen.phrasing import short_description
from palaestra.datagen.recovery import recovery_thought
from palaestra.datagen.sampler import Trace
from palaestra.datagen.schema import parameters, to_openai_tool
from palaestra.datagen.thoughts import closing_thought, parallel_thought, step_thought
from palaestra.datagen.userwords import user_goal
from palaestra.shared.toolcall import ToolCall, format_calls


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
            if param in step.feeds or param in step.prior_feeds:
                continue
            pspec = props.get(param, {})
            if "default" in pspec and (pspec["default"] == value or (pspec["default"] == "None" and value is None)):
                continue  # a documented default: nothing the user has to say
            key = param
            n = 2
            while key in inputs:  # each step's value is its own input: the request states it for that step
                key = f"{param}_{n}"
                n += 1
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

    def make(self, trace: Trace, spec, rng: random.Random) -> AdvancedTool:
        steps = " then ".join(short_description(spec.doc(s.name)).lower() for s in trace.steps)
        last = trace.steps[-1]
        out = [k for k in (spec.doc(last.name).get("response") or {}).get("properties", {})]
        return AdvancedTool(f"{trace.target}_adv", f"Composite operation: {steps}.", free_inputs(trace, spec), out)


class DeterministicQueryWriter:
    """States the user's goal with the values the user knows; intermediate values are described, not stated.

    The trace ends at its target, so the request's goal (the target) and the
    steps it needs before (a login, a prerequisite) determine every call. A
    value an earlier call produces is described by what it is ("the symbol
    for order id 22112", "the id of the one with the highest priority"),
    never by the call that gets it; every stated value is said for its own
    step. Wording varies by the sample's rng (`phrasing`).
    """

    name = "deterministic"

    def write(
        self, tool: AdvancedTool, trace: Trace, spec, rng: random.Random, omit: Sequence[str] = ()
    ) -> Query | None:
        steps = trace.steps
        hidden = set(trace.hidden)
        visible = [i for i in range(len(steps)) if i not in hidden]
        by_step: dict[int, list[tuple[str, Any]]] = {}
        for key, v in tool.inputs.items():
            if key not in omit:
                by_step.setdefault(v["step"], []).append((v["param"], v["value"]))

        def spec_of(i: int, param: str) -> dict:
            return parameters(spec.doc(steps[i].name)).get(param, {})

        goals = []
        for i in visible:
            step = steps[i]
            details = [P.detail(p, v, spec_of(i, p), rng) for p, v in by_step.pop(i, [])]
            for param, src in step.feeds.items():
                key = P.words(step.feed_keys.get(param, param))
                inner = " and ".join(
                    f"{P.param_phrase(p, spec_of(src, p))} {P.value_text(v)}" for p, v in by_step.pop(src, [])
                )
                sel = step.selectors.get(param)
                if sel:
                    ref = f"the {key} of the one with the {sel[1]} {P.words(sel[0])}"
                elif inner:
                    ref = rng.choice(["the {k} for {i}", "the {k} that goes with {i}", "the {k} of the one with {i}"])
                    ref = ref.format(k=key, i=inner)
                else:
                    ref = rng.choice(["my {k}", "the current {k}", "the {k} on record"]).format(k=key)
                name = P.param_phrase(param, spec_of(i, param))
                details.append(ref if P.words(param) == key else f"{name}: {ref}")
            for param, key in step.prior_feeds.items():
                ref = rng.choice(["the {k} you just got", "the same {k} as before", "that {k} from earlier"])
                ref = ref.format(k=P.words(key))
                sel = step.selectors.get(param)
                if sel:  # one of the records an earlier answer listed: the criterion singles it out
                    ref = f"the {P.words(key)} of the one with the {sel[1]} {P.words(sel[0])} from before"
                name = P.param_phrase(param, spec_of(i, param))
                details.append(ref if P.words(param) == P.words(key) else f"{name}: {ref}")
            goal = user_goal(step.name, rng)
            if details:
                goal += rng.choice([" ({d})", " with {d}", ", using {d}"]).format(d="; ".join(details))
            goals.append(goal)
        if trace.parallel:
            text = rng.choice(P.openers(goals[0])).format(g=P.join_parallel(goals, rng))
        elif len(goals) >= 2 and not P.addressed(goals[-1]) and rng.random() < 0.35:
            text = rng.choice(P.GOAL_FIRST).format(goal=goals[-1], pre=P.join_goals(goals[:-1], rng))
        else:
            text = rng.choice(P.openers(goals[0])).format(g=P.join_goals(goals, rng))
        rest = [
            f"{P.param_phrase(p, spec_of(i, p))} is {P.value_text(v)}" for i in sorted(by_step) for p, v in by_step[i]
        ]
        if rest:
            text += " " + rng.choice(P.CONTEXT).format(d=", and my ".join(rest))
        if rng.random() < 0.5:
            text += " " + rng.choice(P.NOISE)
        return Query(text, list(omit))


class DeterministicReasoner:
    """Follows the ground-truth trace and says why each call comes now; may skip hidden steps on the first try.

    The final answer reports what the calls returned (`phrasing.report`), not which tools ran.
    """

    name = "deterministic"

    def __init__(self, naive_first_try: float = 0.3):
        self.naive_first_try = naive_first_try

    def act(self, messages: list[dict], tools: list[dict], turn, try_index: int, rng: random.Random) -> str:
        spec_doc = {t["function"]["name"]: t["function"] for t in tools}
        if turn.kind == "miss_param":
            pspec: dict = next(
                (
                    f["parameters"]["properties"][turn.missing]
                    for f in spec_doc.values()
                    if turn.missing in f.get("parameters", {}).get("properties", {})
                ),
                {},
            )
            what = P.param_phrase(turn.missing or "information", pspec)
            text = rng.choice(
                [
                    "I can do that, but I need the {w} first. Could you tell me the {w}?",
                    "Which {w} should I use?",
                    "Before I start: what is the {w}?",
                    "I'm missing the {w}. Could you give it to me?",
                ]
            ).format(w=what)
            thinking = f"The request needs the {what}, and neither the request nor any earlier result gives it."
            return format_calls([], thinking=thinking, content=text)
        if turn.kind == "miss_func":
            text = rng.choice(
                [
                    "None of the available functions can {m}, so I cannot do this right now.",
                    "I'm sorry, I have no function that can {m}.",
                    "That isn't possible with the tools I have: nothing here can {m}.",
                ]
            ).format(m=turn.missing)
            thinking = f"The request needs a function that can {turn.missing}; no listed function does that."
            return format_calls([], thinking=thinking, content=text)
        done = _tool_results_since_user(messages)
        steps = turn.trace.steps
        plan = list(range(len(steps)))
        if try_index == 0 and turn.trace.hidden and rng.random() < self.naive_first_try:
            plan = [i for i in plan if i not in turn.trace.hidden]
        mistake = getattr(turn, "mistake", None)
        if mistake is not None:  # a flagged error-recovery turn: the wrong call first, then the trace
            if done == 0:
                return format_calls([mistake], thinking=f"{mistake.name} should do this; I call it.")
            done -= 1
        if done >= len(plan):
            # the results the user asked for: the stated steps' (a hidden step's is only a means)
            stated = {s.name for j, s in enumerate(steps) if j not in turn.trace.hidden}
            results = [
                r
                for name, r in _results_since_user(messages, named=True)
                if name in stated and not is_error_response(r)
            ]
            thinking = closing_thought(steps, results, turn.trace.parallel, turn.trace.hidden)
            return format_calls([], thinking=thinking, content=P.report(results, rng))
        if turn.trace.parallel:  # independent calls: all in one message
            calls = [ToolCall(s.name, s.arguments) for s in steps]
            return format_calls(calls, thinking=parallel_thought(steps, messages))
        i = plan[done]
        step = steps[i]
        doc = spec_doc.get(step.name)
        purpose = P.imperative(doc) if doc else "continue"
        thinking = step_thought(steps, i, plan, messages, purpose)
        if mistake is not None and done == 0:
            thinking = recovery_thought(mistake, _last_tool_text(messages)) + " " + thinking
        return format_calls([ToolCall(step.name, step.arguments)], thinking=thinking)


def _last_tool_text(messages: list[dict]) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "tool"), "")


def _results_since_user(messages: list[dict], named: bool = False) -> list:
    """The tool results since the last user message (``(tool name, result)`` pairs when `named`)."""
    out: list = []
    for m in messages:
        if m["role"] in ("user", "system"):
            out = []
        elif m["role"] == "tool":
            try:
                result = json.loads(m["content"])
            except (json.JSONDecodeError, TypeError):
                result = m["content"]
            out.append((m.get("name"), result) if named else result)
    return out


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


def openai_tools(spec, exclude: AbstractSet[str] = frozenset()) -> list[dict]:
    return [to_openai_tool(d) for d in spec.docs if d["name"] not in exclude]


@dataclass
class Roles:
    """The role objects one worker uses: the chain's four stages and the filters (`role_registry`)."""

    tool_maker: Any
    query_writer: Any
    reasoner: Any
    critic: Any
    filters: list = field(default_factory=list)
    """Filters run on every verified sample, in order (`role_registry.Filter`: the LLM judge, ...)."""

    def names(self) -> dict[str, str]:
        names = {k: getattr(self, k).name for k in ("tool_maker", "query_writer", "reasoner", "critic")}
        return names | {f.role: f.name for f in self.filters}


# factories named in `role_registry` (``factory(ctx: RoleContext)``)
def tool_maker(ctx) -> DeterministicToolMaker:
    return DeterministicToolMaker()


def query_writer(ctx) -> DeterministicQueryWriter:
    return DeterministicQueryWriter()


def reasoner(ctx) -> DeterministicReasoner:
    return DeterministicReasoner(ctx.cfg.naive_first_try)


def critic(ctx) -> DeterministicCritic:
    return DeterministicCritic()


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
