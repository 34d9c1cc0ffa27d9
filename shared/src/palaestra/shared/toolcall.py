"""The one response format for tool use: ``<think>``, ``<tool_call>``, plain answers.

An assistant turn is::

    <think>reasoning</think>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with any number of ``<tool_call>`` blocks (parallel calls), or a plain answer
after the think block when no call is due. Arguments are always keyword
arguments (a JSON object). Tool results go back as ``<tool_response>`` in a
``tool`` message; the chat template renders both.

`parse_response` never raises: a malformed turn comes back with ``error`` set.

>>> r = parse_response('<think>hm</think>\\n<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
>>> r.thinking, r.calls, r.error
('hm', [ToolCall(name='f', arguments={'x': 1})], None)
>>> parse_response('<tool_call>{"name": f}</tool_call>').error
'tool call 1 is not valid JSON'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_openai(self, call_id: str | None = None) -> dict:
        """OpenAI-style ``tool_calls`` entry."""
        out = {"type": "function", "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}
        return {"id": call_id, **out} if call_id else out


@dataclass
class ParsedResponse:
    thinking: str | None
    calls: list[ToolCall]
    content: str
    """Text outside the think and tool-call blocks (the plain answer)."""
    error: str | None = None
    """Why the turn does not follow the format, or None."""


def parse_response(text: str, require_think: bool = False) -> ParsedResponse:
    """Split an assistant turn into thinking, tool calls and plain content."""
    thinking = None
    error = None
    match = THINK_RE.search(text)
    if match:
        thinking = match.group(1).strip()
        if text[: match.start()].strip():
            error = "text before <think>"
    elif require_think:
        error = "missing <think>...</think>"
    elif "<think>" in text or "</think>" in text:
        error = "unbalanced <think> tags"
    rest = text[match.end() :] if match else text
    calls: list[ToolCall] = []
    for i, block in enumerate(TOOL_CALL_RE.findall(rest), start=1):
        call, problem = _parse_call(block, i)
        if problem or call is None:
            error = error or problem
        else:
            calls.append(call)
    content = TOOL_CALL_RE.sub("", rest)
    if "<tool_call>" in content or "</tool_call>" in content:
        error = error or "unbalanced <tool_call> tags"
    return ParsedResponse(thinking, calls, content.strip(), error)


def _parse_call(block: str, i: int) -> tuple[ToolCall | None, str | None]:
    try:
        obj = json.loads(block.strip())
    except json.JSONDecodeError:
        return None, f"tool call {i} is not valid JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f"tool call {i} has no string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, f"tool call {i}: arguments are not a JSON object"
    if not isinstance(args, dict):
        return None, f"tool call {i}: arguments are not a JSON object"
    return ToolCall(obj["name"], args), None


def format_calls(calls: list[ToolCall], thinking: str | None = None, content: str = "") -> str:
    """The assistant text for `calls` (the inverse of `parse_response`)."""
    parts = [f"<think>{thinking}</think>"] if thinking is not None else []
    parts += [f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>" for c in calls]
    if content:
        parts.append(content)
    return "\n".join(parts)


def call_string(name: str, arguments: dict) -> str:
    """A call as Python source in BFCL's ground-truth and executor syntax: ``name(key=repr(value), ...)``
    (keyword arguments only: BFCL's decoder drops positional ones).

    >>> call_string("cd", {"folder": "docs", "n": 2})
    "cd(folder='docs', n=2)"
    """
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
