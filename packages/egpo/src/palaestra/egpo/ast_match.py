"""BFCL-AST-style comparison of decoded tool calls with a ground truth of accepted values.

A ground truth is BFCL's *possible answer* form: one ``{function_name: {param: [accepted values]}}``
mapping per expected call. A parameter whose accepted list contains ``""`` is optional. The
rules follow BFCL's ``ast_checker`` (bfcl-eval 2026.3.23), re-implemented here so the reward
needs no bfcl-eval at training time and never raises:

- the function name must match exactly; every required parameter (from the tool's schema) must
  be present; every given parameter must exist in the schema *and* in the ground truth;
- types: the value's type must be the schema's type (``int`` is accepted for ``float``/``number``
  and converted; ``bool`` is not an ``int``); a value of the ground truth's own type is accepted
  as a "variable"; arrays check their items' type one level deep;
- values: strings compared after BFCL's standardization (lowercase, spaces and ``,./-_*^``
  removed, ``'`` -> ``"``); lists element-wise with the same rule for string elements; dicts key by
  key (optional keys marked by ``""``); lists of dicts dict by dict in order; anything else by
  equality with one of the accepted values;
- every ground-truth parameter missing from the call must be optional;
- calls are matched to ground truth as a multiset (order-free, each used once). Where BFCL's
  parallel checker matches greedily in ground-truth order, this finds a full matching: the two
  differ only when a greedy choice blocks a later match (listed by the agreement test).

>>> tools = [{"name": "area", "parameters": {"type": "dict", "required": ["base"],
...           "properties": {"base": {"type": "integer"}, "unit": {"type": "string"}}}}]
>>> gt = [{"area": {"base": [10], "unit": ["units", ""]}}]
>>> match_calls([("area", {"base": 10})], gt, tools) is None
True
>>> match_calls([("area", {"base": 10, "unit": "Units"})], gt, tools) is None
True
>>> match_calls([("area", {"base": 11})], gt, tools)
'call 1 (area): invalid value for parameter \\'base\\': 11'
"""

from __future__ import annotations

import re
from typing import Any


def _sub(mapping: dict, key: str) -> dict:
    """``mapping[key]`` where it is a dict, else an empty one (schemas in the wild leave parts out)."""
    value = mapping.get(key)
    return value if isinstance(value, dict) else {}


# BFCL's Python type names plus the JSON-schema names that datagen-style tools use.
PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "number": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "object": dict,
    "any": str,
}
_NESTED = ("array", "tuple")
_STANDARDIZE_RE = re.compile(r"[ \,\.\/\-\_\*\^]")

GroundTruth = list[dict[str, dict[str, list]]]


def standardize(text: str) -> str:
    """BFCL's string normalization: no spaces or ``,./-_*^``, lowercase, double quotes."""
    return _STANDARDIZE_RE.sub("", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def _answer_type(accepted: list) -> type | None:
    """The type of the first non-optional accepted value (BFCL treats a mismatch as a variable)."""
    for a in accepted:
        if a != "":
            return type(a)
    return None


def _type_ok(value: Any, type_name: str, spec: dict, accepted: list) -> tuple[bool, bool]:
    """(type is acceptable, value is a "variable" of the ground truth's type)."""
    expected = PYTHON_TYPES[type_name]
    answer_type = _answer_type(accepted) if isinstance(accepted, list) else None
    is_variable = answer_type is not None and answer_type is not expected
    seq: Any = value  # (`type(value) is expected` would narrow `value` to object for mypy)
    if type(value) is expected:
        if type_name not in _NESTED:
            return True, is_variable
        items = _sub(spec, "items")
        item_type = items.get("type")
        if item_type not in PYTHON_TYPES:
            return True, is_variable
        for candidate in accepted:
            # a non-list candidate (e.g. the optional marker "") imposes nothing on the items
            if not isinstance(candidate, list) or all(_type_ok(item, item_type, {}, candidate)[0] for item in seq):
                return True, is_variable
        return False, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _dict_ok(value: dict, accepted: list) -> bool:
    for candidate in accepted:
        if not isinstance(candidate, dict):
            continue
        ok = True
        for key, val in value.items():
            options = candidate.get(key)
            if not isinstance(options, list) or _std(val) not in [_std(o) for o in options]:
                ok = False
                break
        if ok and all(key in value or (isinstance(v, list) and "" in v) for key, v in candidate.items()):
            return True
    return False


def _list_of_dicts_ok(value: list, accepted: list) -> bool:
    for candidate in accepted:
        if not isinstance(candidate, list | str) or len(candidate) != len(value):
            continue
        if all(isinstance(v, dict) and _dict_ok(v, [c]) for v, c in zip(value, candidate)):
            return True
    return False


def _list_ok(value: list, accepted: list) -> bool:
    mine = [_std(v) for v in value]
    return any(isinstance(c, list | str) and mine == [_std(x) for x in c] for c in accepted)


def _value_error(param: str, value: Any, spec: dict, accepted: list) -> str | None:
    """Why `value` is not acceptable for `param`, or None."""
    type_name = spec.get("type") if isinstance(spec, dict) else None
    if type_name not in PYTHON_TYPES:  # a type BFCL does not know: plain equality
        return None if value in accepted else f"invalid value for parameter {param!r}: {value!r}"
    if type_name in ("float", "number") and type(value) is int:
        value = float(value)  # BFCL's auto-conversion
    ok, is_variable = _type_ok(value, type_name, spec, accepted)
    if not ok:
        return f"wrong type for parameter {param!r}: expected {type_name}, got {type(value).__name__}"
    expected = PYTHON_TYPES[type_name]
    if not is_variable:
        items = _sub(spec, "items")
        if expected is dict:
            good = _dict_ok(value, accepted)
        elif expected is list and PYTHON_TYPES.get(str(items.get("type"))) is dict:
            good = _list_of_dicts_ok(value, accepted)
        elif expected is str:
            good = standardize(value) in [standardize(a) for a in accepted if isinstance(a, str)]
        elif expected is list:
            good = _list_ok(value, accepted)
        else:
            good = value in accepted
    else:
        good = value in accepted
    return None if good else f"invalid value for parameter {param!r}: {value!r}"


def find_tool(tools: list[dict], name: str) -> dict | None:
    for tool in tools:
        doc = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(doc, dict) and doc.get("name") == name:
            return doc
    return None


def check_call(name: str, arguments: dict, expected: dict[str, dict[str, list]], tools: list[dict]) -> str | None:
    """Why one decoded call does not match one ground-truth call, or None if it does."""
    try:
        (gt_name, accepted_by_param), *_ = expected.items()
    except (AttributeError, ValueError):
        return "malformed ground truth"
    if name != gt_name:
        return f"wrong function name {name!r} (expected {gt_name!r})"
    doc = find_tool(tools, gt_name) or {}
    params = _sub(doc, "parameters")
    props = _sub(params, "properties")
    for param in params.get("required") or []:
        if param not in arguments:
            return f"missing required parameter {param!r}"
    for param, value in arguments.items():
        if param not in props or param not in accepted_by_param:
            return f"unexpected parameter {param!r}"
        accepted = accepted_by_param[param]
        if not isinstance(accepted, list):
            accepted = [accepted]
        error = _value_error(param, value, props[param], accepted)
        if error:
            return error
    for param, accepted in accepted_by_param.items():
        if param not in arguments and not (isinstance(accepted, list) and "" in accepted):
            return f"missing parameter {param!r}"
    return None


def match_calls(calls: list[tuple[str, dict]], ground_truth: GroundTruth, tools: list[dict]) -> str | None:
    """Match decoded calls to the ground truth as a multiset; None when they match, else why not."""
    if len(calls) != len(ground_truth):
        return f"wrong number of calls: {len(calls)} (expected {len(ground_truth)})"
    errors: dict[tuple[int, int], str | None] = {}
    for i, (name, args) in enumerate(calls):
        for j, expected in enumerate(ground_truth):
            errors[i, j] = check_call(name, args, expected, tools)
    # bipartite matching by augmenting paths (a handful of calls at most)
    owner: dict[int, int] = {}

    def assign(i: int, seen: set[int]) -> bool:
        for j in range(len(ground_truth)):
            if errors[i, j] is None and j not in seen:
                seen.add(j)
                if j not in owner or assign(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(calls)):
        if not assign(i, set()):
            reasons = {errors[i, j] for j in range(len(ground_truth))}
            reason = errors[i, i] if i < len(ground_truth) and len(reasons) > 1 else next(iter(reasons))
            return f"call {i + 1} ({calls[i][0]}): {reason}"
    return None
