"""Argument candidates for a call: where the sampler gets plausible values.

For each parameter, candidates come from (best first):

1. *output-to-input mappings*: values in earlier responses of the same trace
   whose key matches the parameter name (``access_token`` -> ``access_token``,
   ``id`` -> ``ticket_id``); these make intermediate steps necessary;
2. environment hints: ``ApiEnvSpec.arg_hints[param](instance, rng, chosen)``
   (for BFCL: files in the current directory, ticket ids, airport codes...);
3. allowed values from the schema (``enum`` or ``[Enum]: ...`` in the text);
4. values mined from the environment's public state under a matching key;
5. literals of the parameter's type.

`propose_arguments` draws one assignment; the sampler executes it on a fork
of the environment and keeps it only if the call succeeds.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Sequence
from typing import Any

from palaestra.datagen.schema import coerce, enum_values, parameters, required, type_matches

GENERIC_TOKENS = {"to", "of", "the", "a", "list", "new", "current", "status", "value", "name", "type"}
SENTENCES = [
    "Quarterly numbers look solid.",
    "Please review the attached notes.",
    "Meeting moved to Friday afternoon.",
    "System maintenance scheduled tonight.",
    "Great progress on the project!",
]
WORDS = ["report", "budget", "notes", "summary", "alpha", "draft", "update"]
FREE_TEXT_PARAMS = {"keyword", "query", "comment", "text", "body", "note"}
TEXT_PARAMS = {"content", "message", "comment_content", "title", "description", "resolution", "messages"}


def _value_like(value: Any) -> bool:
    """An id, a name, a number, a token: not a sentence (a status message echoed back is no argument)."""
    return not (isinstance(value, str) and (len(value) > 40 or value.count(" ") > 2))


def tokens(name: str) -> set[str]:
    name = re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()
    return {t for t in re.split(r"[^a-z0-9]+", name) if t}


def names_match(param: str, key: str) -> bool:
    """Whether a response/state key can feed a parameter (by name)."""
    if param == key:
        return True
    p, k = tokens(param), tokens(key)
    if k == {"id"}:
        return "id" in p
    shared = (p & k) - GENERIC_TOKENS - {"id"}
    return bool(shared) and ("id" in p) == ("id" in k)


def key_described(key: str, described: set[str]) -> bool:
    """A response key named in the parameter's description ("The zipcode of the first city")."""
    k = tokens(key) - {"to", "of", "the", "a", "id"}  # every word of the key: ``token_type`` is no ``access token``
    return bool(k) and k <= described and len(key) > 3


NUMERIC = {"number", "integer", "float"}


def compatible_key(param: str, pspec: dict, key: str) -> bool:
    """Whether a response key can feed `param`: by name, or named in the parameter's description, or a bare
    computed ``result`` into a numeric parameter ("now multiply that result by 3": MathAPI's chains)."""
    if key == "result" and pspec.get("type") in NUMERIC:
        return True
    return names_match(param, key) or key_described(key, tokens(pspec.get("description", "") or ""))


def unique_candidates(value: Any, outputs: list[tuple[str, Any]], param: str, pspec: dict) -> list | None:
    """The distinct values of the parameter's type at keys compatible with `param` in `outputs` (only those at a
    key named exactly as the parameter, where there is one) if `value` is the only one, else None."""
    want_list = isinstance(value, list)
    kind = pspec.get("type", "string")
    seen: list = []
    if any(key == param for key, _ in outputs):  # a key named as the parameter is the source (access_token)
        outputs = [(key, v) for key, v in outputs if key == param]
    for key, v in outputs:
        if not type_matches(coerce(v, kind), kind):
            continue  # a status text is no candidate for an integer id
        if isinstance(v, list) == want_list and compatible_key(param, pspec, key) and v not in seen:
            seen.append(v)
    return seen if seen == [value] else None


def records(output: Any) -> list[dict]:
    """The records of a response: a list of dicts, a dict of dicts, or such a list under one key."""
    if isinstance(output, list) and output and all(isinstance(r, dict) for r in output):
        return output
    if isinstance(output, dict) and output:
        if all(isinstance(r, dict) for r in output.values()):
            return list(output.values())
        for v in output.values():
            if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
                return v
    return []


def superlative(value: Any, output: Any, param: str, pspec: dict) -> tuple[str, str, str] | None:
    """``(key, sibling, "highest" | "lowest")`` when `value` is, among a response's records (two or more), the
    one whose numeric `sibling` field is strictly highest or lowest: a choice the user can state as a criterion
    ("the ticket with the highest priority") instead of a value."""
    rows = records(output)
    if len(rows) < 2:
        return None
    for key in sorted({k for r in rows for k in r}):
        if not compatible_key(param, pspec, key) or [r.get(key) for r in rows].count(value) != 1:
            continue
        mine = next(r for r in rows if r.get(key) == value)
        for sibling in sorted(k for k in mine if k != key):
            raw = [r.get(sibling) for r in rows]
            nums = [float(n) for n in raw if isinstance(n, int | float) and not isinstance(n, bool)]
            if len(nums) < len(raw):
                continue
            if mine[sibling] == max(nums) and nums.count(max(nums)) == 1:
                return key, sibling, "highest"
            if mine[sibling] == min(nums) and nums.count(min(nums)) == 1:
                return key, sibling, "lowest"
    return None


def leaves(obj: Any, key: str = "", depth: int = 0, out: list | None = None) -> list[tuple[str, Any]]:
    """(key, value) pairs under `obj`: scalars, lists of scalars, and dict keys under their parent key."""
    out = [] if out is None else out
    if depth > 6 or len(out) > 400:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str | int) and not isinstance(k, bool) and isinstance(v, dict) and key:
                out.append((key, k))
            leaves(v, str(k) if isinstance(k, str) and not k.isdigit() else key, depth + 1, out)
    elif isinstance(obj, list | tuple):
        if obj and all(isinstance(v, str | int | float) for v in obj):
            out.append((key, list(obj)))
        for v in obj:
            leaves(v, key, depth + 1, out)
    elif isinstance(obj, str | int | float | bool) and key:
        out.append((key, obj))
    elif hasattr(obj, "__dict__") and not callable(obj):
        leaves({k: v for k, v in vars(obj).items() if not k.startswith("_")}, key, depth + 1, out)
    return out


def literals(spec: dict, pname: str, rng: random.Random) -> list:
    kind = spec.get("type", "string")
    if kind in ("integer", "int"):
        return [1, 2, 3, 5, 10]
    if kind in ("number", "float"):
        return [2.0, 3.5, 10.0, 25.0, 100.0]
    if kind in ("boolean", "bool"):
        return [True, False]
    if kind in ("array", "tuple", "list"):
        item = spec.get("items", {"type": "string"}) or {"type": "string"}
        pool = enum_values(spec) or literals(item, pname, rng)
        return [rng.sample(pool, k=min(len(pool), n)) for n in (1, 2, 3)]
    if kind in ("object", "dict"):
        return [{}]
    return SENTENCES if pname in TEXT_PARAMS else WORDS


def candidates(
    env, tool: str, pname: str, prior_outputs: list[tuple[str, Any]], rng: random.Random, chosen: dict
) -> list[tuple[Any, str]]:
    """Candidate values for one parameter, each with its source, best source first."""
    spec = parameters(env.spec.doc(tool))[pname]
    kind = spec.get("type", "string")
    found: list[tuple[Any, str]] = []

    def add(values, source):
        for v in values:
            v = coerce(v, kind)
            if type_matches(v, kind) and (v, source) not in found:
                found.append((v, source))

    described = tokens(spec.get("description", "") or "")
    text_param = pname in TEXT_PARAMS or pname in FREE_TEXT_PARAMS
    if not text_param:  # free text is the user's to write; an echoed status message is not a value
        add(
            [
                v
                for k, v in reversed(prior_outputs)
                if (names_match(pname, k) or key_described(k, described)) and _value_like(v)
            ],
            "output",
        )
    hint = env.spec.hints().get(f"{tool}.{pname}") or env.spec.hints().get(pname)
    if hint is not None:
        with contextlib.suppress(Exception):  # a broken hint only loses its candidates
            add(list(hint(env.instance, rng, chosen)), "hint")
    add(enum_values(spec), "enum")
    if not text_param and not any(src in ("hint", "enum") for _, src in found):
        add([v for k, v in leaves(env.public_state()) if names_match(pname, k) and type_matches(v, kind)], "state")
    if not found:
        add(literals(spec, pname, rng), "literal")
    return found


def propose_arguments(
    env,
    tool: str,
    prior_outputs: list[tuple[str, Any]],
    rng: random.Random,
    prefer_outputs: bool = True,
    raw_outputs: Sequence = (),
) -> tuple[dict, dict[str, str]]:
    """One argument assignment for `tool` and where each value came from.

    `raw_outputs` (earlier responses of the trace, whole): among output candidates, half the time prefer one
    that a numeric field singles out of several records (`superlative`), a choice the query can state.
    """
    doc = env.spec.doc(tool)
    args: dict = {}
    sources: dict[str, str] = {}
    needed = set(required(doc))
    for pname in parameters(doc):
        if pname not in needed and rng.random() < 0.6:
            continue  # optional parameters: sometimes left to their defaults
        options = candidates(env, tool, pname, prior_outputs, rng, args)
        if not options:
            continue
        # an earlier result feeds one parameter of a call, not several (multiply(a=r, b=r) is no chain)
        taken = list(args.values())
        best = [o for o in options if o[1] == "output" and o[0] not in taken] if prefer_outputs else []
        pspec = parameters(doc)[pname]
        singled = [o for o in best if any(superlative(o[0], out, pname, pspec) for out in raw_outputs)]
        if singled and rng.random() < 0.5:
            best = singled
        value, source = best[0] if best and rng.random() < 0.85 else rng.choice(options[:8])
        args[pname] = value
        sources[pname] = source
    return args, sources
