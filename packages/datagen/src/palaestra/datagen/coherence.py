"""Goal coherence of a sample, checked by replay: every step follows from the user's goal.

`check_row` reads the emitted row (its initial config, its recorded trace, its messages) and replays each
turn's steps in a fresh environment. It returns the problems it finds; the pipeline drops a sample with one
as ``coherence_<problem>`` and ``stats.json`` counts them. The checks:

- ``unneeded_step``: a step before the goal (the turn's last call) feeds no needed later step, and removing
  it changes no needed later step's result nor makes one fail. A needed step is the goal, or one that
  feeds or enables a needed step. A hidden step and a stated prerequisite ("to get there, Y first") both
  have to pass; ``unneeded_prerequisite`` names the stated ones.
- ``unrequested_state_change``: a hidden step (its result is only described to the user) changes the
  environment's public state. The request asks for the stated steps only, so such a change is not asked.
- ``kind_mismatch``: a value flows from a response key into a parameter of another kind (an id into a
  name, a climate mode into a headlight mode; `value_kind`), or a number-like parameter gets a word.
- ``empty_range``: a ``min_X`` / ``max_X`` pair of arguments with min >= max.
- ``unreported_result``: a turn's closing reply states none of what a requested step returned (a long
  text may be quoted in part), or says there was nothing to report while something came back.
- ``dependent_parallel``: a parallel turn (calls in one message, every one a stated goal) whose calls are not
  independent: one alone returns something else than in the batch, or the reverse order differs
  (`parallel.independent`).
- ``broken_dependency``: a value recorded as carried (``feeds``: from a step of this turn at ``feed_keys``;
  ``prior_feeds``: from an earlier turn at that key) is not what the replayed source returned there.

These are heuristics over names and replays, not a proof of intent.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from palaestra.datagen.argfill import leaves, tokens
from palaestra.datagen.envs import ToolEnv, is_error_response
from palaestra.datagen.phrasing import words
from palaestra.datagen.schema import parameters

PROBLEMS = (
    "unneeded_step",
    "unneeded_prerequisite",
    "unrequested_state_change",
    "kind_mismatch",
    "empty_range",
    "unreported_result",
    "dependent_parallel",
    "broken_dependency",
)
"""Every problem `check_row` can report, in the order it checks them."""

KIND_TOKENS = {
    "date": {"date", "time", "day", "month", "year", "timestamp", "deadline"},
    "id": {"id", "ids", "token", "symbol", "zipcode", "zip", "code", "number", "key"},
    "name": {"name", "names", "username", "title", "city", "airport", "location", "destination", "origin"},
    "count": {"precision", "count", "limit", "decimals", "digits", "quantity"},
    "amount": {"amount", "price", "balance", "cost", "fee", "total", "budget", "temperature", "distance",
               "speed", "volume", "rate", "gallon", "liter", "level", "value", "pressure"},
    "mode": {"mode", "type", "status", "class", "category", "priority", "preference", "unit"},
}  # fmt: skip
"""Kind of a parameter or a response key by its words; the first kind listed that matches wins."""
QUALIFIED_KINDS = {"mode", "date"}
"""Kinds whose other words must agree too: a climate mode is not a headlight mode, an expiry not a travel date."""
GENERIC = {"current", "new", "result", "the", "a", "of", "get", "set", "outside", "inside", "my", "is"}
NOTHING_TO_REPORT = re.compile(r"nothing (else|more) (to report|came back)", re.I)
QUOTE_CHARS = 24
"""A long text counts as reported when this many of its first characters appear in the reply."""


def value_kind(name: str) -> str | None:
    """The kind of a parameter or key by its words (`KIND_TOKENS`), or None."""
    words = tokens(name)
    for kind, marks in KIND_TOKENS.items():
        if words & marks:
            return kind
    return None


def _env(row: dict, spec) -> ToolEnv:
    config = json.loads(row["initial_config"])
    return ToolEnv(spec, config.get(spec.bfcl_class or spec.name, {}))


def _replay(env: ToolEnv, steps: list[dict]) -> tuple[list[Any], list[bool]]:
    outs, oks = [], []
    for s in steps:
        ex = env.execute(s["name"], s["arguments"])
        outs.append(json.dumps(ex.output, sort_keys=True, default=str))
        oks.append(ex.ok)
    return outs, oks


def _hidden(steps: list[dict]) -> set[int]:
    return {i for s in steps for i in s["feeds"].values() if i < len(steps) - 1}


def needed_steps(start: ToolEnv, steps: list[dict]) -> set[int]:
    """Indices of the steps the goal (the last) needs: it, and every step that feeds or enables a needed one
    (enables: replayed without it, a needed later step's result differs or the call fails)."""
    full, _ = _replay(start.copy(), steps)
    needed = {len(steps) - 1}
    for i in range(len(steps) - 2, -1, -1):
        if any(src == i for j in needed for src in steps[j]["feeds"].values()):
            needed.add(i)
            continue
        rest = [j for j in range(len(steps)) if j != i]
        outs, oks = _replay(start.copy(), [steps[j] for j in rest])
        changed = {j for j, out, ok in zip(rest, outs, oks) if not ok or out != full[j]}
        if changed & needed:
            needed.add(i)
    return needed


def kind_problem(src_key: str, param: str, doc: dict, tool: str) -> bool:
    """Whether a value read from response key `src_key` is of another kind than `tool`'s `param`."""
    pspec = parameters(doc).get(param, {})
    desc = tokens(pspec.get("description", ""))
    src_kind, param_kind = value_kind(src_key), value_kind(param)
    marks = tokens(src_key) & KIND_TOKENS.get(src_kind or "", set())
    if src_kind not in QUALIFIED_KINDS and marks - {"id"} and marks <= desc:
        return False  # the parameter's description names what flows in ("cityA: the zipcode of the first city")
    if src_kind != param_kind and param_kind is not None and (src_kind is not None or param_kind in ("count",)):
        return True
    if src_kind == param_kind and src_kind in QUALIFIED_KINDS:
        qualifiers = tokens(src_key) - KIND_TOKENS[src_kind] - GENERIC
        return bool(qualifiers) and not qualifiers & (tokens(param) | tokens(tool) | desc)
    return False


def empty_range(arguments: dict) -> bool:
    """Whether a ``min_X`` / ``max_X`` pair of `arguments` has min >= max."""
    for param, low in arguments.items():
        words = tokens(param)
        mark = "min" if "min" in words else "minimum" if "minimum" in words else None
        if mark is None:
            continue
        other = param.replace(mark, "max" if mark == "min" else "maximum")
        high = arguments.get(other)
        numbers = (int, float)
        if isinstance(low, numbers) and isinstance(high, numbers) and not isinstance(low, bool) and low >= high:
            return True
    return False


def _closing_replies(row: dict) -> list[str]:
    """Per user turn that made calls, its last assistant text (after ``</think>``), in order."""
    replies, calls = [], False
    for m in row["messages"]:
        if m["role"] in ("user", "system"):
            calls = False
        elif m["role"] == "tool":
            calls = True
        elif m["role"] == "assistant" and not m.get("tool_calls") and calls:
            replies.append((m["content"] or "").split("</think>")[-1])
            calls = False
    return replies


def reported(output: Any, reply: str) -> bool | None:
    """Whether `reply` states something of `output` (None: nothing there to report)."""
    pairs = [(k, v) for k, v in leaves(output, "result") if not isinstance(v, dict) and v not in ("", [], None)]
    if not pairs:
        return None
    low = reply.lower()
    for key, v in pairs:
        if isinstance(v, bool) and words(key) in low:
            return True
        for x in v if isinstance(v, list) else [v]:
            text = x.strip() if isinstance(x, str) else repr(x) if not isinstance(x, bool) else ""
            if text and (text.lower() in low or (len(text) > QUOTE_CHARS and text[:QUOTE_CHARS].lower() in low)):
                return True
            if isinstance(x, int | float) and not isinstance(x, bool) and str(x) in reply:
                return True
    return False


def check_row(row: dict, spec) -> list[str]:
    """The coherence problems of a row (see the module docstring), each once, in `PROBLEMS` order."""
    found: set[str] = set()
    env = _env(row, spec)
    traces = json.loads(row["provenance"]["trace"])
    replies = _closing_replies(row)
    earlier: list[tuple[str, Any]] = []  # replayed response entries of earlier turns
    for t, trace in enumerate(traces):
        steps = trace["steps"]
        if not steps:
            continue
        hidden = _hidden(steps)
        if trace.get("parallel"):
            from palaestra.datagen.parallel import independent

            needed = set(range(len(steps)))  # every call is a stated goal
            if hidden or not independent(env, [(s["name"], s["arguments"]) for s in steps]):
                found.add("dependent_parallel")
        else:
            needed = needed_steps(env, steps) if len(steps) > 1 else {0}
        for i in range(len(steps) - 1):
            if i not in needed:
                found.add("unneeded_step" if i in hidden else "unneeded_prerequisite")
        replayed: list[Any] = []
        for i, s in enumerate(steps):
            doc = spec.doc(s["name"])
            before = env.copy()
            if _broken(s, replayed, earlier):
                found.add("broken_dependency")
            replayed.append(env.execute(s["name"], s["arguments"]).output)
            if i in hidden and not before.same_state(env):
                found.add("unrequested_state_change")
            keys = {**{p: s["feed_keys"].get(p, p) for p in s["feeds"]}, **s.get("prior_feeds", {})}
            if any(kind_problem(k, p, doc, s["name"]) for p, k in keys.items()):
                found.add("kind_mismatch")
            for p, v in s["arguments"].items():
                if "number" in tokens(p) and isinstance(v, str) and not re.search(r"\d", v):
                    found.add("kind_mismatch")  # card_number='Visa'
            if empty_range(s["arguments"]):
                found.add("empty_range")
        earlier += [pair for out in replayed for pair in leaves(out, "result")]
        reply = replies[t] if t < len(replies) else ""
        wanted = [steps[i]["output"] for i in range(len(steps)) if i not in hidden]
        verdicts = [reported(o, reply) for o in wanted if not is_error_response(o)]
        if any(v is False for v in verdicts) or (
            any(v is not None for v in verdicts) and NOTHING_TO_REPORT.search(reply)
        ):
            found.add("unreported_result")
    return [p for p in PROBLEMS if p in found]


def _broken(step: dict, replayed: list, earlier: list[tuple[str, Any]]) -> bool:
    """Whether a carried value of `step` is not what its replayed source returned (see the docstring)."""
    for param, src in step["feeds"].items():
        key = step.get("feed_keys", {}).get(param, param)
        value = step["arguments"].get(param)
        pairs = leaves(replayed[src], "result") if src < len(replayed) else []
        if not any(v == value or (isinstance(v, list) and value in v) for k, v in pairs if k == key):
            return True
    for param, key in step.get("prior_feeds", {}).items():
        value = step["arguments"].get(param)
        if not any(v == value for k, v in earlier if k == key):
            return True
    return False


# -- used by the sampler, so that it builds coherent traces rather than have them dropped
def step_breaks_coherence(step: Any, steps: list, doc: dict) -> bool:
    """Whether `step` would break goal coherence (`coherence`): it reads a value from a step that changed the
    state (that step would be a hidden state change the user did not ask for), a value flows into it from a
    key of another kind, or its arguments hold an empty range."""
    if any(steps[src].changes_state for src in step.feeds.values()):
        return True
    keys = {**{p: step.feed_keys.get(p, p) for p in step.feeds}, **step.prior_feeds}
    return any(kind_problem(k, p, doc, step.name) for p, k in keys.items()) or empty_range(step.arguments)


def needed_only(start: ToolEnv, steps: list, env: ToolEnv, prerequisites) -> tuple[list, ToolEnv]:
    """The steps without those the goal does not need (`coherence.needed_steps`: they feed nothing needed and
    enable nothing), when the rest replays to the same results; else the steps as they are. A call of a kept
    step's prerequisite tool (`prerequisites(tool)`, the graph's) stays: the trace remains legal."""
    records = [{"name": s.name, "arguments": s.arguments, "feeds": s.feeds} for s in steps]
    needed = needed_steps(start, records) if len(steps) > 1 else set(range(len(steps)))
    for i in range(len(steps) - 1, -1, -1):
        if i in needed:  # feeds and prerequisites point back, so one pass down closes the set
            needed |= {j for j in range(i) if steps[j].name in set(prerequisites(steps[i].name))}
            needed |= set(steps[i].feeds.values())
    if len(needed) == len(steps):
        return steps, env
    index = {old: new for new, old in enumerate(sorted(needed))}
    kept = [replace(steps[i], feeds={p: index[src] for p, src in steps[i].feeds.items()}) for i in sorted(needed)]
    replay = start.copy()
    outs = [replay.execute(s.name, s.arguments).output for s in kept]
    if json.dumps(outs, sort_keys=True, default=str) != json.dumps(
        [s.output for s in kept], sort_keys=True, default=str
    ):
        return steps, env
    return kept, replay
