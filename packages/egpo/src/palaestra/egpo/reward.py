"""EGPO's strict binary reward for function calling, registered as ``fc_binary`` (and ``fc_multi_turn``).

``fc_binary(sample, completion)`` is 1.0 exactly when

1. the completion follows the paper's format as `palaestra.shared.toolcall` reads it: ``<think>...</think>``
   (required unless ``require_think=False``), then either only ``<tool_call>`` blocks (whitespace between them,
   nothing else: text between ``</think>`` and the first call, between calls or after the last one scores 0),
   or a plain answer when no call is due; and
2. BFCL accepts the answer: BFCL's Qwen FC handler decodes the response as BFCL stores it and BFCL's runner
   checks it (`palaestra.egpo.bfcl_handler`): ``ast_checker`` against the ground truth (the task's BFCL category
   where it has one, else ``parallel_multiple``, BFCL's order-free multiset rule), or BFCL's relevance rule where
   no call is due. The tools go to BFCL's checker in BFCL's type names (`bfcl_function_docs`). So a ``"parameters"``
   key, arguments given as a JSON string, a call without ``arguments`` or compact ``<tool_call>{...}</tool_call>``
   tags score 0, as BFCL's leaderboard scores them.

Anything else is 0.0. The leniencies are named rewards of their own, off in the paper config:
``fc_binary_lenient`` allows text around the tool calls (BFCL still decides), ``fc_binary_lenient_decode`` is
the earlier rule (our decoder, which also reads a ``"parameters"`` key, JSON-string arguments and compact tags,
and `palaestra.egpo.ast_match`'s re-implementation of BFCL's value rules; no bfcl-eval needed). The reward never
raises on a sample (a malformed one scores 0.0 with the reason in the info dict); without bfcl-eval installed
``fc_binary`` raises `BFCLNotInstalled`, since it could not score anything.

``sample`` is an `FCTask` or a mapping with ``tools`` and ``ground_truth`` (BFCL possible-answer form,
see `palaestra.egpo.tasks`). The multi-turn variant ``fc_multi_turn`` reads the verdict that the
multi-turn environment computed with BFCL's ``multi_turn_checker`` (state and results).

>>> task = {"tools": [{"name": "f", "parameters": {"properties": {"x": {"type": "integer"}}, "required": ["x"]}}],
...         "ground_truth": [{"f": {"x": [1]}}]}
>>> fc_binary(task, '<think>call f</think>\\n<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
(1.0, {'reason': 'ok'})
>>> fc_binary(task, '<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')[0]
0.0
>>> fc_binary(task, '<think>call f</think>Sure!\\n<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
(0.0, {'reason': 'format: text between </think> and the tool calls'})
"""

from __future__ import annotations

from typing import Any

from palaestra.egpo.ast_match import match_calls
from palaestra.egpo.tasks import tool_doc
from palaestra.shared.rewards import REWARDS
from palaestra.shared.toolcall import THINK_RE, TOOL_CALL_RE, parse_response


def _field(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


def wrapper_text_error(completion: str) -> str | None:
    """Why a completion with tool calls carries text outside its think and call blocks, or None.

    Only answers with calls are concerned: a plain answer (no call due) is text by definition."""
    match = THINK_RE.search(completion)
    rest = completion[match.end() :] if match else completion
    blocks = list(TOOL_CALL_RE.finditer(rest))
    if not blocks:
        return None
    if rest[: blocks[0].start()].strip():
        return "text between </think> and the tool calls"
    for before, after in zip(blocks, blocks[1:]):
        if rest[before.end() : after.start()].strip():
            return "text between the tool calls"
    if rest[blocks[-1].end() :].strip():
        return "text after the tool calls"
    return None


_TO_BFCL_TYPES = {"object": "dict", "number": "float"}


def _bfcl_schema(spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    if isinstance(spec.get("type"), str):
        out["type"] = _TO_BFCL_TYPES.get(spec["type"], spec["type"])
    if isinstance(spec.get("properties"), dict):
        out["properties"] = {k: _bfcl_schema(v) for k, v in spec["properties"].items()}
    if "items" in spec:
        out["items"] = _bfcl_schema(spec["items"])
    return out


def bfcl_function_docs(tools: list[dict], ground_truth: list | None = None) -> list[dict]:
    """Function docs in BFCL's form for its checker: JSON-schema ``object`` / ``number`` as ``dict`` / ``float``, the
    parameters a ``dict`` with a ``required`` list, and an ``array`` without ``items`` (BFCL's checker needs them)
    given the element type of the ground truth's accepted lists (``string`` when they do not tell). BFCL's own docs
    pass unchanged."""
    accepted: dict[tuple[str, str], list] = {}
    for item in ground_truth or []:
        for name, params in item.items():
            for param, values in (params or {}).items():
                accepted.setdefault((name, param), []).extend(values if isinstance(values, list) else [values])
    docs = []
    for tool in tools:
        doc = dict(tool_doc(tool))
        params = _bfcl_schema(doc.get("parameters") or {"properties": {}})
        params["type"] = "dict"
        params.setdefault("properties", {})
        params.setdefault("required", [])
        for pname, spec in params["properties"].items():
            if isinstance(spec, dict) and spec.get("type") in ("array", "tuple") and "items" not in spec:
                spec["items"] = {"type": _element_type(accepted.get((doc.get("name", ""), pname), []))}
        docs.append({**doc, "parameters": params})
    return docs


def _element_type(values: list) -> str:
    names: dict[type, str] = {bool: "boolean", int: "integer", float: "float", str: "string"}
    names.update({dict: "dict", list: "array"})
    kinds = {names.get(type(x), "?") for v in values if isinstance(v, list) for x in v}
    if kinds == {"integer", "float"}:
        return "float"
    return kinds.pop() if len(kinds) == 1 and "?" not in kinds else "string"


def bfcl_judgement(sample: Any, completion: str) -> tuple[bool, str]:
    """BFCL's verdict on a completion (see the module docstring); raises only when bfcl-eval is missing."""
    from palaestra.egpo import bfcl, bfcl_handler

    bfcl.require_bfcl()
    model = bfcl_handler.DEFAULT_MODEL
    category = str(_field(sample, "category") or "")
    ground_truth = _field(sample, "ground_truth") or []
    if category not in bfcl.AST_CATEGORIES + bfcl.RELEVANCE_CATEGORIES:
        category = "parallel_multiple" if ground_truth else "irrelevance"
    tools = bfcl_function_docs(_field(sample, "tools") or _field(sample, "tool_docs") or [], ground_truth)
    stored = bfcl_handler.stored_response(model, completion)
    sample_id = str(_field(sample, "id") or "sample")
    verdict = bfcl_handler.score_single_turn(model, sample_id, category, stored, tools, ground_truth)
    return verdict["valid"], "ok" if verdict["valid"] else f"bfcl: {verdict['error_type']}"


def judge_completion(
    sample: Any, completion: str, require_think: bool = True, strict: bool = True, decoder: str = "bfcl"
) -> tuple[bool, str]:
    """(correct, reason) for one single-turn completion; never raises on a sample. ``strict``: no text around the
    calls; ``decoder``: ``bfcl`` (BFCL's decoder and checker decide) or ``palaestra`` (ours and `match_calls`)."""
    from palaestra.egpo.bfcl import BFCLNotInstalled

    try:
        if not isinstance(completion, str):
            return False, f"completion is {type(completion).__name__}, not text"
        parsed = parse_response(completion, require_think=require_think)
        if parsed.error:
            return False, f"format: {parsed.error}"
        wrapper = wrapper_text_error(completion) if strict else None
        if wrapper:
            return False, f"format: {wrapper}"
        if decoder == "bfcl":
            return bfcl_judgement(sample, completion)
        ground_truth = _field(sample, "ground_truth") or []
        tools = _field(sample, "tools") or _field(sample, "tool_docs") or []
        if not ground_truth:
            return (not parsed.calls, "ok" if not parsed.calls else "called a tool where none is due")
        if not parsed.calls:
            return False, "no tool call"
        error = match_calls([(c.name, c.arguments) for c in parsed.calls], ground_truth, tools)
        return (error is None, error or "ok")
    except BFCLNotInstalled:
        raise
    except Exception as err:  # the reward must never take a training run down
        return False, f"reward error: {type(err).__name__}: {err}"


@REWARDS.register("fc_binary")
def fc_binary(sample: Any, completion: str, require_think: bool = True, **info: Any) -> tuple[float, dict]:
    """1.0 iff the paper's format holds and BFCL's decoder and checker accept the answer."""
    correct, reason = judge_completion(sample, completion, require_think=require_think)
    return (1.0 if correct else 0.0), {"reason": reason}


@REWARDS.register("fc_binary_lenient")
def fc_binary_lenient(sample: Any, completion: str, require_think: bool = True, **info: Any) -> tuple[float, dict]:
    """`fc_binary` with text around the tool calls allowed (BFCL's decoder and checker still decide)."""
    correct, reason = judge_completion(sample, completion, require_think=require_think, strict=False)
    return (1.0 if correct else 0.0), {"reason": reason}


@REWARDS.register("fc_binary_lenient_decode")
def fc_binary_lenient_decode(sample: Any, completion: str, require_think: bool = True, **info: Any) -> tuple:
    """The earlier rule: our decoder (a ``"parameters"`` key, JSON-string arguments, compact tags read too) and
    `palaestra.egpo.ast_match`; no bfcl-eval needed. Pays for answers BFCL's leaderboard scores 0."""
    correct, reason = judge_completion(sample, completion, require_think=require_think, decoder="palaestra")
    return (1.0 if correct else 0.0), {"reason": reason}


@REWARDS.register("fc_multi_turn")
def fc_multi_turn(sample: Any, completion: str, **info: Any) -> tuple[float, dict]:
    """1.0 iff BFCL's multi-turn checker accepted the episode (``info['multi_turn_valid']``, set by the env)."""
    valid = bool(info.get("multi_turn_valid", False))
    return (1.0 if valid else 0.0), {"reason": info.get("multi_turn_error") or ("ok" if valid else "no verdict")}
