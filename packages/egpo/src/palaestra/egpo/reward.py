"""EGPO's strict binary reward for function calling, registered as ``fc_binary`` (and ``fc_multi_turn``).

``fc_binary(sample, completion)`` is 1.0 only if

1. the completion follows the format of `palaestra.shared.toolcall` *exactly*: ``<think>...</think>``
   (required unless ``require_think=False``), then either only ``<tool_call>`` blocks with JSON keyword
   arguments (whitespace between them, nothing else: text between ``</think>`` and the first call,
   between calls or after the last one scores 0), or a plain answer when no call is due; and
2. the decoded calls equal the ground truth as a multiset, values compared as BFCL's AST checker
   compares them (`palaestra.egpo.ast_match`).

Anything else is 0.0. The paper's binary reward pays only for the exact format; the strict rule keeps a
policy from learning chatty wrappers around its calls at no cost. ``fc_binary_lenient`` is the same
reward with the wrapper text allowed (the calls are still decoded and matched). The reward never
raises: any failure (a malformed sample included) scores 0.0
with the reason in the info dict.

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


def judge_completion(sample: Any, completion: str, require_think: bool = True, strict: bool = True) -> tuple[bool, str]:
    """(correct, reason) for one single-turn completion; never raises. ``strict``: no text around the calls."""
    try:
        if not isinstance(completion, str):
            return False, f"completion is {type(completion).__name__}, not text"
        parsed = parse_response(completion, require_think=require_think)
        if parsed.error:
            return False, f"format: {parsed.error}"
        wrapper = wrapper_text_error(completion) if strict else None
        if wrapper:
            return False, f"format: {wrapper}"
        ground_truth = _field(sample, "ground_truth") or []
        tools = _field(sample, "tools") or _field(sample, "tool_docs") or []
        if not ground_truth:
            return (not parsed.calls, "ok" if not parsed.calls else "called a tool where none is due")
        if not parsed.calls:
            return False, "no tool call"
        error = match_calls([(c.name, c.arguments) for c in parsed.calls], ground_truth, tools)
        return (error is None, error or "ok")
    except Exception as err:  # the reward must never take a training run down
        return False, f"reward error: {type(err).__name__}: {err}"


@REWARDS.register("fc_binary")
def fc_binary(sample: Any, completion: str, require_think: bool = True, **info: Any) -> tuple[float, dict]:
    """1.0 iff the format holds and the calls equal the ground truth (BFCL-AST values, order-free)."""
    correct, reason = judge_completion(sample, completion, require_think=require_think)
    return (1.0 if correct else 0.0), {"reason": reason}


@REWARDS.register("fc_binary_lenient")
def fc_binary_lenient(sample: Any, completion: str, require_think: bool = True, **info: Any) -> tuple[float, dict]:
    """`fc_binary` with text around the tool calls allowed (the calls must still decode and match)."""
    correct, reason = judge_completion(sample, completion, require_think=require_think, strict=False)
    return (1.0 if correct else 0.0), {"reason": reason}


@REWARDS.register("fc_multi_turn")
def fc_multi_turn(sample: Any, completion: str, **info: Any) -> tuple[float, dict]:
    """1.0 iff BFCL's multi-turn checker accepted the episode (``info['multi_turn_valid']``, set by the env)."""
    valid = bool(info.get("multi_turn_valid", False))
    return (1.0 if valid else 0.0), {"reason": info.get("multi_turn_error") or ("ok" if valid else "no verdict")}
