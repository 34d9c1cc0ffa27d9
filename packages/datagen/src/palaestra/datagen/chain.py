"""Guided iterative chain: reasoner tries, replay-based verification, critic hints, up to K_max tries.

One user turn is a `TurnTask`. A try runs the reasoner turn by turn on a fork
of the environment at the turn's start: each ``<tool_call>`` is executed and
its response fed back as a ``tool`` message, until the reasoner answers
without a call (or ``max_steps``). The try is then *verified*: the ground
truth is replayed on another fork from the same start state, and the try
passes iff the public state of the environment is equal and every
ground-truth result appears among the try's results (unordered), as BFCL's
multi-turn checker does. A turn whose right answer is to ask for a missing
parameter or to say a function is missing passes iff it makes no call.

On failure the critic writes a hint; it is redacted (`roles.redact`: no
ground-truth call or argument value survives) and appended to the user
message of the next try only. Passing messages are kept without the hint.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from palaestra.datagen.envs import Execution, ToolEnv
from palaestra.datagen.grounding import asked_names
from palaestra.datagen.roles import Roles
from palaestra.datagen.sampler import Trace
from palaestra.shared.toolcall import ToolCall, parse_response

MAX_CALLS_PER_TURN = 16


@dataclass
class TurnTask:
    query: str
    trace: Trace
    tools: list[dict]
    kind: str = "normal"
    """normal | miss_param | miss_func | param_given | func_added."""
    missing: str | None = None
    """The withheld parameter (miss_param, param_given), what the withheld function does (miss_func), or its name
    (func_added)."""
    schema: dict | None = None
    """func_added: the schema of the function that becomes available (shown in the system message)."""
    mistake: Any = None
    """A failing first call the reasoner makes and recovers from (`recovery`; a ``ToolCall``), or None."""

    @property
    def expects_calls(self) -> bool:
        return self.kind not in ("miss_param", "miss_func")

    def summary(self) -> str:
        return ", ".join(s.name for s in self.trace.steps)


@dataclass
class TryResult:
    messages: list[dict]
    env: ToolEnv
    calls: list[ToolCall]
    executions: list[Execution]
    passed: bool
    failure: dict = field(default_factory=dict)
    truth: ToolEnv | None = None
    """The environment after replaying the ground truth (the next turn starts from it)."""


def run_try(
    roles: Roles,
    env_start: ToolEnv,
    history: list[dict],
    turn: TurnTask,
    hint: str | None,
    try_index: int,
    rng: random.Random,
    max_steps: int,
) -> TryResult:
    env = env_start.copy()
    user = _user_message(turn, hint)
    messages = list(history) + ([user] if user else [])
    new: list[dict] = []
    calls: list[ToolCall] = []
    executions: list[Execution] = []
    for _ in range(max_steps):
        text = roles.reasoner.act(messages + new, turn.tools, turn, try_index, rng) or ""
        parsed = parse_response(text)
        parsed.calls = parsed.calls[:MAX_CALLS_PER_TURN]  # a runaway model cannot flood the environment
        if not parsed.calls:
            new.append({"role": "assistant", "content": text.strip(), "tool_calls": None})
            break
        ids = [f"call_{len(executions) + k}" for k in range(len(parsed.calls))]
        thinking = f"<think>{parsed.thinking}</think>" if parsed.thinking is not None else ""
        new.append(
            {
                "role": "assistant",
                "content": thinking,
                "tool_calls": [c.to_openai(i) for c, i in zip(parsed.calls, ids)],
            }
        )
        allowed = {t["function"]["name"] for t in turn.tools}
        for call, call_id in zip(parsed.calls, ids):
            if call.name in allowed:
                ex = env.execute(call.name, call.arguments)
            else:
                ex = Execution(call.name, call.arguments, {"error": f"no such function: {call.name}"}, False)
            calls.append(call)
            executions.append(ex)
            new.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": call.name,
                    "content": json.dumps(ex.output, default=str),
                }
            )
    passed, failure, truth = verify_turn(env_start, env, turn, executions)
    if (
        passed
        and turn.kind == "miss_param"
        and not asks_for(new[-1]["content"] if new else "", turn.missing or "", turn.tools)
    ):
        passed, failure = False, {"no_question": True}
    if user and hint:  # the kept conversation carries the original request, not the hint
        user = _user_message(turn, None)
    return TryResult(([user] if user else []) + new, env, calls, executions, passed, failure, truth)


def _user_message(turn: TurnTask, hint: str | None) -> dict | None:
    if turn.kind == "func_added":
        schema = json.dumps(turn.schema) if turn.schema else turn.missing
        return {"role": "system", "content": f"A new function is now available: {schema}"}
    text = turn.query + (f"\n\n(Hint from a reviewer: {hint})" if hint else "")
    return {"role": "user", "content": text}


def asks_for(reply: str, param: str, tools: Sequence[dict] = ()) -> bool:
    """Whether a reply asks a question that names the parameter (its words, e.g. ``file name``, or the phrase
    a user says for it, e.g. ``zipcode of the second city`` for ``cityB``: `grounding.asked_names`)."""
    answer = reply.split("</think>")[-1].lower()
    words = " ".join(re.findall(r"[a-z0-9]+", answer))
    return "?" in answer and any(f" {n} " in f" {words} " for n in asked_names(param, list(tools)))


def canonical(output) -> str:
    return json.dumps(output, sort_keys=True, default=str)


def verify_turn(env_start: ToolEnv, env_after: ToolEnv, turn: TurnTask, executions: list[Execution]):
    """(passed, failure details, truth env): replay the ground truth from the same start and compare."""
    if not turn.expects_calls:
        return (not executions), ({} if not executions else {"unexpected_calls": len(executions)}), env_start.copy()
    truth = env_start.copy()
    expected = [truth.execute(s.name, s.arguments) for s in turn.trace.steps]
    got = [canonical(e.output) for e in executions]
    missing = []
    for step, ex in zip(turn.trace.steps, expected):
        key = canonical(ex.output)
        if key in got:
            got.remove(key)
        else:
            missing.append(step.name)
    state_ok = truth.same_state(env_after)
    if not missing and state_ok:
        return True, {}, truth
    return False, {"missing_tools": missing, "state_mismatch": not state_ok}, truth


def failure_kind(result: TryResult) -> str:
    """Why a try failed, in one word (the drop reason of a sample whose tries all fail)."""
    f = result.failure
    if f.get("unexpected_calls"):
        return "called_when_not_due"
    if f.get("no_question"):
        return "no_question"
    if not result.calls:
        return "prose"  # an answer in prose where a tool call was due (the drop names the reasoner)
    if any(not e.ok for e in result.executions):
        return "failed_call"
    if f.get("missing_tools"):
        return "missing_results"
    return "state_mismatch" if f.get("state_mismatch") else "unknown"


def guided_chain(
    roles: Roles,
    env_start: ToolEnv,
    history: list[dict],
    turn: TurnTask,
    k_max: int,
    rng: random.Random,
    max_steps: int,
    stats: dict,
) -> TryResult | None:
    """Up to `k_max` tries with critic hints; the passing try, or None. Counts tries and passes in `stats`."""
    hint = None
    values = [v for s in turn.trace.steps for v in s.arguments.values()]
    calls = turn.trace.calls
    for k in range(k_max):
        result = run_try(roles, env_start, history, turn, hint, k, rng, max_steps)
        stats.setdefault("tries", [0] * k_max)[k] += 1
        if result.passed:
            stats.setdefault("passes", [0] * k_max)[k] += 1
            return result
        stats["last_failure"] = failure_kind(result)
        if k + 1 < k_max:
            from palaestra.datagen.roles import redact

            raw = roles.critic.critique(turn, result.calls, result.failure, rng) or ""
            hint = redact(raw, values, calls).strip() or None
            stats["hints"] = stats.get("hints", 0) + 1
            if raw and hint != raw.strip():
                stats["hints_redacted"] = stats.get("hints_redacted", 0) + 1
    return None
