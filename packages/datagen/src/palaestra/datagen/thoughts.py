"""The deterministic reasoner's `<think>` text, built from the trace's own facts.

No sentence list to draw from: each thought states what this step is for in
the trace's structure (the goal; a lookup whose result a named later call
takes; a stated step the goal needs first; several independent calls at
once), where each argument comes from (the request, or which earlier call
returned it, in this turn or an earlier one, and under which key, or the
record a criterion singles out), and how far the turn is. So the text varies
with the structure and the values, the way the trace does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from palaestra.datagen import phrasing as P

ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]


def _first_upper(text: str) -> str:
    """The first letter upper case, the rest as is (`str.capitalize` would lower a value: 'CRH' -> 'crh')."""
    return text[:1].upper() + text[1:]


def _v(value: Any) -> str:
    text = P.value_text(value)
    return text if len(text) <= 40 else "a long value"


def _source(value: Any, messages: list[dict]) -> tuple[str, int] | None:
    """The earlier tool call (its name, and how many user turns back) whose result holds `value`."""
    users = 0
    for m in reversed(messages):
        if m["role"] == "user":
            users += 1
        if m["role"] != "tool" or not users:  # this turn's own results are no earlier request's
            continue
        try:
            out = json.loads(m["content"])
        except (json.JSONDecodeError, TypeError):
            continue
        if _holds(out, value):
            return m.get("name") or "an earlier call", users
    return None


def _holds(obj: Any, value: Any) -> bool:
    if isinstance(obj, dict):
        return any(_holds(v, value) for v in obj.values())
    if isinstance(obj, list):
        return any(_holds(v, value) for v in obj)
    return obj == value and not isinstance(obj, bool)


def provenance(step, steps: list, messages: list[dict]) -> list[str]:
    """Where each argument of `step` comes from, one clause per argument."""
    parts: list[str] = []
    stated: list[str] = []
    plural = False
    for param, value in step.arguments.items():
        name = P.words(param)
        if param in step.feeds:
            src = steps[step.feeds[param]].name
            key = P.words(step.feed_keys.get(param, param))
            sel = step.selectors.get(param)
            which = f" of the record with the {sel[1]} {P.words(sel[0])}" if sel else ""
            parts.append(f"{name} {_v(value)} is the {key}{which} that {src} returned")
        elif param in step.prior_feeds:
            found = _source(value, messages)
            sel = step.selectors.get(param)
            which = f" of the record with the {sel[1]} {P.words(sel[0])}" if sel else ""
            key = P.words(step.prior_feeds[param]) + which
            if found:
                back = "the previous request" if found[1] <= 1 else f"the request {found[1]} turns back"
                parts.append(f"{name} {_v(value)} is the {key} {found[0]} returned for {back}")
            else:
                parts.append(f"{name} {_v(value)} is the {key} an earlier request got back")
        else:
            stated.append(f"{name} {_v(value)}")
            plural = plural or isinstance(value, list)
    if stated:
        said = stated[0] if len(stated) == 1 else ", ".join(stated[:-1]) + " and " + stated[-1]
        parts.append(f"{said} {'are' if plural or len(stated) > 1 else 'is'} in the user's message")
    return parts


def step_thought(steps: list, i: int, plan: list[int], messages: list[dict], purpose: str) -> str:
    """Why step `i` comes now and where its arguments come from (`purpose`: what the tool does, in words)."""
    step = steps[i]
    goal = steps[-1].name
    later = [(j, p) for j, s in enumerate(steps) for p, src in s.feeds.items() if src == i and j in plan]
    if later:
        j, param = later[0]
        key = P.words(steps[j].feed_keys.get(param, param))
        why = f"{steps[j].name} needs a {P.words(param)} I do not have yet; {step.name} returns the {key}"
    elif i == len(steps) - 1:
        fed = sorted({steps[src].name for src in step.feeds.values()})
        prior = bool(step.prior_feeds)
        if fed:
            why = f"With what {' and '.join(fed)} gave me, {step.name} can now {purpose}, which is what was asked"
        elif prior:
            why = f"This request builds on an earlier result: {step.name} will {purpose} with it"
        else:
            why = f"The user asks me to {purpose}; {step.name} does exactly that"
    else:
        why = f"{goal} only works once this is done, so {step.name} comes first to {purpose}"
    facts = provenance(step, steps, messages)
    if not step.arguments:
        facts.append("it takes no arguments")
    text = why + "."
    if step.changes_state and i < len(steps) - 1:
        text += " It changes the state, and the request asks for that change."
    elif step.changes_state:
        text += " This call changes the state."
    if facts:
        text += " " + _first_upper("; ".join(facts)) + "."
    left = len(plan) - plan.index(i) - 1 if i in plan else 0
    if len(plan) > 1:
        text += f" Call {plan.index(i) + 1} of {len(plan)}" + (f", {left} to go." if left else ", the last.")
    return text


def parallel_thought(steps: list, messages: list[dict]) -> str:
    """Why the calls go out together, and where their arguments come from."""
    names = sorted({s.name for s in steps})
    n = len(steps)
    if len(names) == 1:
        head = f"The user wants {names[0]} {n} times with different arguments"
    else:
        head = f"The user wants {n} separate things: {', '.join(names)}"
    head += "; no call needs another's result, so I make all of them in one go."
    facts = []
    for k, s in enumerate(steps):
        parts = provenance(s, steps, messages)
        facts.append(f"The {ORDINALS[k]} ({s.name}): " + (", ".join(parts) if parts else "no arguments") + ".")
    return head + " " + " ".join(facts)


def closing_thought(steps: list, results: list, parallel: bool = False, hidden: Sequence[int] = ()) -> str:
    """Before the closing answer: what was done, and what the goal returned."""
    from palaestra.datagen.argfill import leaves

    n = len(steps)
    if not n:
        return "Nothing was called."
    goal = steps[-1].name
    facts = [(k, v) for k, v in leaves(results[-1], "result") if not isinstance(v, dict)] if results else []
    changed = sum(1 for s in steps if s.changes_state)
    if parallel:
        text = f"All {n} calls came back without an error"
        if changed:
            text += f" ({changed} of them changed the state, independently)"
    elif n == 1:
        text = f"{goal} came back without an error"
    else:
        chain = " -> ".join(s.name for s in steps)
        text = f"The chain {chain} ran through"
    if facts:
        key, value = facts[0]
        text += f"; {goal} gave {P.words(key) or 'the result'} {_v(value)}"
    lookups = sum(len(s.feeds) + len(s.prior_feeds) for s in steps)
    if lookups:
        text += f", using {lookups} value{'s' if lookups > 1 else ''} I looked up rather than asked for"
    asked = [s.name for i, s in enumerate(steps) if i not in hidden]
    if len(asked) > 1:
        return text + f". The answer gives what {', '.join(asked[:-1])} and {asked[-1]} returned."
    return text + "."
