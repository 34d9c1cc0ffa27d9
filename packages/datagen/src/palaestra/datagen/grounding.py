"""Groundedness verifier: every ground-truth argument has a source the model can see; special turns are right.

`verify_row(row, spec)` reads an emitted row (its user turns, ground-truth
calls, recorded outputs and messages; not the generator's bookkeeping) and
returns the problems found, each a reason string (an empty list: grounded).
An argument of a ground-truth call is grounded when it is

- *stated*: the value appears in the request the call answers (strings case-
  insensitively as a whole phrase, a short or common word only in quotes;
  numbers in any of their usual spellings; a boolean as the parameter's words
  with yes/no/true/false; lists and dicts element by element), once per
  mention (`verify_row` says how), and not as a value only a tool output
  could have given the user (``leaked_value``);
- *produced*: it appears in the output of an earlier ground-truth call of the
  sample, under a key that can feed the parameter (`argfill.compatible_key`),
  and it is the only candidate there, or it is the one record of several
  whose numeric field is strictly highest / lowest and the user says so
  ("the highest priority"; `argfill.superlative`); any other choice among
  candidates is ``ambiguous_choice``;
- a *documented default* of the parameter (its doc's ``default``).

Also checked: no ground-truth step's output is an error response
(`envs.is_error_response`), a ``miss_param`` turn's reply asks for the missing
parameter (names it and asks a question) and the missing value cannot be
found in anything said or returned before, and for ``miss_func`` the
withheld function is not among the row's tools, is not called before it is
added, is added by a system message that carries its schema, and is the
function the turn needs.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from palaestra.datagen.argfill import compatible_key, leaves, superlative, unique_candidates
from palaestra.datagen.envs import is_error_response
from palaestra.datagen.phrasing import param_phrase, words
from palaestra.datagen.schema import parameters

COMMON_WORDS = frozenset(
    """
    the and for with from this that list all new file files name text read write open close start
    stop up down left right on off yes no true false none null today now here there user report
    notes update
    """.split()  # noqa: SIM905
)
"""Words that occur in any request: as a string argument they count as stated only when quoted."""
YES, NO = {"yes", "true", "on", "enable", "enabled"}, {"no", "false", "off", "disable", "disabled"}


def parse_call(call: str) -> tuple[str, dict]:
    """``name(k=v, ...)`` (BFCL syntax, keyword arguments only) -> (name, arguments)."""
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a keyword-only call: {call}")
    return node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}


def asked_names(param: str, tools: list[dict]) -> set[str]:
    """What a question for `param` may call it: its words, or the phrase a user says (`phrasing.param_phrase`)."""
    names = {words(param)}
    for tool in tools:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties", {})
        if param in props:
            names.add(param_phrase(param, props[param]))
    return {n for n in names if n}


def _words(text: str) -> str:
    """Lowercased words joined by single spaces, padded (punctuation dropped, except inside tokens)."""
    words = [w.strip(".-/") for w in re.sub(r"[^a-z0-9.@#_/-]+", " ", text.lower()).split()]
    return " " + " ".join(w for w in words if w) + " "


def _number_forms(value: float | int) -> set[str]:
    forms = {repr(value), f"{value:g}", f"{value:,}"}
    if float(value).is_integer():
        forms |= {str(int(value)), f"{int(value):,}"}
    return forms


def stated(value: Any, text: str, param: str) -> bool:
    """Whether `value` for `param` is said in `text` (see the module docstring)."""
    text_words = _words(text)
    if isinstance(value, bool):
        pwords = words(param)
        said = YES if value else NO
        return f" {pwords} " in text_words and any(f" {w} " in text_words for w in said)
    if isinstance(value, int | float):
        return any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text) for f in _number_forms(value))
    if isinstance(value, str):
        if not _words(value).strip():  # ".", "..": punctuation is the value
            return bool(value.strip()) and f"'{value}'" in text
        if value.strip().isalpha() and (len(value.strip()) <= 3 or value.strip().lower() in COMMON_WORDS):
            return any(f"{q}{value}{q}".lower() in text.lower() for q in "'\"")
        return _words(value) in text_words
    if isinstance(value, list):
        return all(stated(v, text, param) for v in value) if value else False
    if isinstance(value, dict):
        return bool(value) and all(stated(v, text, k) for k, v in value.items())
    return value is None and False


def documented_default(pspec: dict, value: Any) -> bool:
    if "default" not in pspec:
        return False
    default = pspec["default"]
    return value == default or (default == "None" and value is None)


def mentions(value: Any, text: str) -> int:
    """How many times a scalar value is said in `text` (strings as whole words, numbers in usual spellings)."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int | float):
        spans: set[int] = set()
        for f in _number_forms(value):
            spans |= {m.start() for m in re.finditer(rf"(?<![\d.]){re.escape(f)}(?![\d])", text)}
        return len(spans)
    if isinstance(value, str) and value.strip():
        return len(re.findall(rf"(?<![A-Za-z0-9_]){re.escape(value)}(?![A-Za-z0-9_])", text, flags=re.I))
    return 0


def tool_made(value: Any) -> bool:
    """An id, a token, a computed figure: a value a user knows only from their data or a tool's answer."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, float) and not value.is_integer():
        return True
    if isinstance(value, int | float):
        return abs(value) >= 1000
    return isinstance(value, str) and len(value) >= 3


def _answers_before(row: dict, query: str) -> str:
    """The assistant's answers (after ``</think>``) before the user message `query`: what the user has read."""
    out = []
    for m in row["messages"]:
        if m["role"] == "user" and m["content"] == query:
            break
        if m["role"] == "assistant":
            out.append((m["content"] or "").split("</think>")[-1])
    return "\n".join(out)


def verify_row(row: dict, spec) -> list[str]:
    """Problems of one row (reason strings, possibly repeated); [] when every check holds.

    A value counts as stated only in the request its call answers (the turn's query; for the answer to a
    miss_param question, that question's query too) and once per mention: a value said for one step does not
    ground another (``borrowed_value``), nor does a value said in an earlier turn. A stated value that only
    an earlier tool output holds (not the initial state, not an earlier request or answer) is
    ``leaked_value``: the user could not have known it.
    """
    problems: list[str] = []
    steps = [s for t in json.loads(row["provenance"]["trace"]) for s in t["steps"]]
    tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
    listed = {t["function"]["name"] for t in tools}
    withheld = {f for m in row.get("missed_function", []) for f in m["functions"]}
    known = row.get("initial_config") or ""
    outputs: list[tuple[str, Any]] = []
    said = ""
    k = 0
    called: set[str] = set()
    for t, turn in enumerate(row["turns"]):
        said += "\n" + (turn.get("query") or "")
        start = t - 1 if turn["kind"] in ("param_given", "func_added") and t > 0 else t
        own = "\n".join(x.get("query") or "" for x in row["turns"][start : t + 1])
        seen = (
            known
            + _answers_before(row, turn.get("query") or "")
            + "\n".join(x.get("query") or "" for x in row["turns"][:start])
        )
        uses: dict[str, int] = {}
        if turn["kind"] == "miss_param":
            problems += _check_miss_param(row, t, turn, said, outputs)
        if turn["kind"] == "miss_func":
            problems += _check_miss_func(row, t, turn, listed)
        for call in turn["ground_truth"]:
            name, args = parse_call(call)
            if name in withheld and not _added_before(row, t, name):
                problems.append("miss_func_called_early")
            called.add(name)
            props = parameters(spec.doc(name))
            for param, value in args.items():
                pspec = props.get(param, {})
                if documented_default(pspec, value):
                    continue
                produced = any(v == value and compatible_key(param, pspec, key) for key, v in outputs)
                if stated(value, own, param):
                    key = json.dumps(value, sort_keys=True, default=str)
                    uses[key] = uses.get(key, 0) + 1
                    countable = not isinstance(value, bool | list | dict) and value is not None
                    if not countable or uses[key] <= max(1, mentions(value, own)):
                        if tool_made(value) and any(v == value for _, v in outputs) and not mentions(value, seen):
                            problems.append("leaked_value")
                        known += "\n" + key
                        continue
                    if not produced:
                        problems.append("borrowed_value")
                        continue
                if produced:
                    if unique_candidates(value, outputs, param, pspec) is None and not _resolved_by_criterion(
                        value, [s["output"] for s in steps[:k]], param, pspec, own
                    ):
                        problems.append("ambiguous_choice")
                    continue
                problems.append("borrowed_value" if stated(value, said, param) else "ungrounded_argument")
            if k >= len(steps) or steps[k]["name"] != name:
                problems.append("trace_mismatch")
                return problems
            if is_error_response(steps[k]["output"]):
                problems.append("error_response")
            outputs += leaves(steps[k]["output"], "result")
            k += 1
    return problems


def _resolved_by_criterion(value: Any, raw_outputs: list, param: str, pspec: dict, said: str) -> bool:
    """One of several records, singled out by a numeric field the user names ("the highest priority")."""
    for output in reversed(raw_outputs):
        best = superlative(value, output, param, pspec)
        if best is not None and f" {best[2]} {words(best[1])} " in _words(said):
            return True
    return False


def _added_before(row: dict, turn: int, name: str) -> bool:
    return any(name in m["functions"] and m["turn"] <= turn for m in row.get("missed_function", []))


def _reply_after(row: dict, query: str) -> str:
    """The assistant's text answer to the user message `query`."""
    messages = row["messages"]
    for i, m in enumerate(messages):
        if m["role"] == "user" and m["content"] == query:
            for after in messages[i + 1 :]:
                if after["role"] == "assistant":
                    return (after["content"] or "").split("</think>")[-1]
    return ""


def _check_miss_param(row: dict, t: int, turn: dict, said: str, outputs: list) -> list[str]:
    problems = []
    missing = turn.get("missing") or ""
    reply = _reply_after(row, turn["query"]).lower()
    asked = " " + " ".join(re.findall(r"[a-z0-9]+", reply)) + " "
    tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
    if not missing or "?" not in reply or not any(f" {n} " in asked for n in asked_names(missing, tools)):
        problems.append("miss_param_reply")
    given = row["turns"][t + 1] if t + 1 < len(row["turns"]) else None
    value = given.get("missing_value") if given else None
    if given is None or given["kind"] != "param_given":
        problems.append("miss_param_unanswered")
    elif value is not None and (stated(value, said, missing) or any(v == value for _, v in outputs)):
        problems.append("miss_param_derivable")
    return problems


def _check_miss_func(row: dict, t: int, turn: dict, listed: set[str]) -> list[str]:
    problems = []
    added = [m for m in row.get("missed_function", []) if m["turn"] == t + 1]
    if not added:
        return ["miss_func_unmarked"]
    (name,) = added[0]["functions"]
    if name in listed:
        problems.append("miss_func_listed")
    system = [m for m in row["messages"] if m["role"] == "system" and f'"{name}"' in (m["content"] or "")]
    if not system:
        problems.append("miss_func_schema_missing")
    nxt = row["turns"][t + 1] if t + 1 < len(row["turns"]) else None
    if nxt is None or not any(parse_call(c)[0] == name for c in nxt["ground_truth"]):
        problems.append("miss_func_not_needed")
    return problems
