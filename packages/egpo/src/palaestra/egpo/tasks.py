"""Single-turn function-calling tasks, their loaders, and the one prompt format.

An `FCTask` is a conversation up to the model's answer (system + user messages), the available
tools (function docs: ``name``, ``description``, ``parameters`` as JSON schema, or BFCL's variant of
it), and the ground truth in BFCL's *possible answer* form: one ``{name: {param: [accepted values]}}``
per expected call (several for parallel calls, none when no tool fits). An exact call becomes
``{name: {param: [value]}}`` (`exact_ground_truth`).

Loaders:

- `load_bfcl`: BFCL's own data (``bfcl_eval/data/BFCL_v4_<category>.json`` + ``possible_answer``);
- `load_jsonl`: one file, any of these record shapes per line:

  - OpenAI-style chat (datagen's output): ``messages`` (system/user, then an assistant message with
    ``tool_calls``), ``tools`` (OpenAI ``{"type": "function", "function": {...}}`` or bare docs);
    the first assistant turn's calls are the ground truth (a task per assistant turn that follows
    a user message, up to that point);
  - xLAM / APIGen style: ``query``, ``tools``, ``answers`` (lists or JSON strings of
    ``{"name", "arguments"}``);
  - explicit: ``messages`` or ``query``, ``tools``, ``ground_truth`` (possible-answer form or calls).

The public releases' own layouts (xlam-function-calling-60k with its Python type names, APIGen-MT-5k,
FunReason-MT, HardGen), hub datasets and the contamination check: `palaestra.egpo.public_data`.

Prompt format: tools go to the chat template (rendered into the system prompt); the model answers
``<think>...</think>`` then ``<tool_call>`` blocks with keyword arguments, or a plain answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.rollout.tasks import TASKS

# the public sets' task source, imported when first named (`palaestra.egpo.public_data`)
TASKS.register("public_fc_tasks", "palaestra.egpo.public_data:public_fc_tasks")

SYSTEM_PROMPT = (
    "You are an expert in composing function calls. Think step by step inside <think>...</think>, then call the "
    "functions you need, each as a <tool_call> block with a JSON object with keys 'name' and 'arguments' "
    "(keyword arguments). If no function fits, say so in plain text without calling any."
)

_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


@dataclass
class FCTask:
    """One single-turn function-calling task."""

    id: str
    messages: list[dict]
    """The conversation up to the answer (system prompt included if the source has one)."""
    tools: list[dict]
    """Function docs (``name``, ``description``, ``parameters``); BFCL type names allowed."""
    ground_truth: list[dict[str, dict[str, list]]] = field(default_factory=list)
    """Possible-answer form: per expected call ``{name: {param: [accepted values]}}``; empty: no call is due."""
    category: str = ""
    """BFCL category or the source's name."""
    thinking: str | None = None
    """The source's own reasoning before the expected answer (its ``<think>`` text), where it has one."""

    def prompt_messages(self) -> list[dict]:
        """The messages to render: our system prompt first unless the task brings its own."""
        if self.messages and self.messages[0].get("role") == "system":
            return list(self.messages)
        return [{"role": "system", "content": SYSTEM_PROMPT}, *self.messages]

    def chat_tools(self) -> list[dict]:
        return [to_chat_tool(t) for t in self.tools]

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "messages": self.messages,
            "tools": self.tools,
            "ground_truth": self.ground_truth,
            "category": self.category,
        }


def _json_schema(spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "type" and isinstance(value, str):
            out[key] = _JSON_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: _json_schema(v) for k, v in value.items()}
        elif key == "items":
            out[key] = _json_schema(value)
        else:
            out[key] = value
    return out


def tool_doc(tool: dict) -> dict:
    """The bare function doc of an OpenAI-style tool (or the doc itself)."""
    return tool["function"] if isinstance(tool.get("function"), dict) else tool


def to_chat_tool(doc: dict) -> dict:
    """OpenAI-style tool for the chat template, BFCL type names mapped to JSON schema."""
    doc = tool_doc(doc)
    params = _json_schema(doc.get("parameters") or {"type": "object", "properties": {}})
    params["type"] = "object"
    return {
        "type": "function",
        "function": {"name": doc["name"], "description": doc.get("description", ""), "parameters": params},
    }


def exact_ground_truth(calls: list[dict], tools: list[dict] | None = None) -> list[dict[str, dict[str, list]]]:
    """Exact calls (``{"name", "arguments"}``) as possible-answer form; optional schema parameters with a
    ``default`` are accepted when omitted or given their default."""
    docs = {tool_doc(t).get("name"): tool_doc(t) for t in tools or []}
    out = []
    for call in calls:
        name, args = call["name"], call.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        answer = {k: [_accepted_form(v)] for k, v in args.items()}
        params = (docs.get(name) or {}).get("parameters") or {}
        required = set(params.get("required") or [])
        for pname, spec in (params.get("properties") or {}).items():
            if pname not in answer and pname not in required and isinstance(spec, dict) and "default" in spec:
                answer[pname] = ["", spec["default"]]
        out.append({name: answer})
    return out


def _accepted_form(value: Any) -> Any:
    # BFCL compares dict arguments key by key against lists of accepted values (one level deep)
    if isinstance(value, dict):
        return {k: [v] for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [{k: [x] for k, x in v.items()} for v in value]
    return value


def canonical_calls(ground_truth: list[dict[str, dict[str, list]]], tools: list[dict] | None = None) -> list[dict]:
    """One correct answer of a possible-answer ground truth: the first accepted value of each parameter,
    optional ones (``""`` accepted) left out unless the tool's schema requires them."""
    docs = {tool_doc(t).get("name"): tool_doc(t) for t in tools or []}
    calls = []
    for item in ground_truth:
        for name, accepted in item.items():
            required = set(((docs.get(name) or {}).get("parameters") or {}).get("required") or [])
            calls.append({"name": name, "arguments": _first_accepted(accepted, required)})
    return calls


def _first_accepted(accepted: dict[str, list], required: AbstractSet[str] = frozenset()) -> dict:
    args = {}
    for param, values in accepted.items():
        if not isinstance(values, list) or not values:
            continue
        given = [v for v in values if v != ""]
        if given and ("" not in values or param in required):
            args[param] = _canonical_value(given[0])
    return args


def _canonical_value(value: Any) -> Any:
    # dict values are themselves possible answers ({key: [accepted]}), also inside lists of dicts
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        return _first_accepted(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_canonical_value(v) for v in value]
    return value


# ---- loaders ----------------------------------------------------------------------------------


def load_bfcl(category: str, limit: int | None = None) -> list[FCTask]:
    """BFCL's single-turn entries of a category (AST or relevance) as tasks."""
    from palaestra.egpo.bfcl import category_kind, load_category

    if category_kind(category) == "multi_turn":
        raise ValueError(f"{category!r} is multi-turn: use palaestra.egpo.multiturn.BFCLMultiTurnEnv")
    tasks = []
    for entry, truth in load_category(category, limit):
        messages = [m for turn in entry["question"] for m in turn]
        tasks.append(FCTask(entry["id"], messages, entry["function"], truth or [], category))
    return tasks


def parse_json_field(value: Any, what: str) -> Any:
    """A field that holds JSON either decoded or as a string (datasets store both); ValueError naming `what`."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{what} is not valid JSON: {err.msg}") from None
    return value


def _calls_of(message: dict) -> list[dict]:
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function", tc)
        calls.append(
            {"name": fn["name"], "arguments": parse_json_field(fn.get("arguments", {}), "tool call arguments")}
        )
    return calls


def _is_possible_answer(truth: list) -> bool:
    return all(isinstance(t, dict) and len(t) == 1 and "name" not in t for t in truth)


TURNS = ("all", "first", "every")
"""Which assistant messages of a conversation become tasks: ``all`` (each answer to a user message), ``first`` (the
first of those), ``every`` (every assistant message, after a user message or a tool result, with the whole
history before it: HardGen's authors' split "at each assistant response"; a final text answer is a task where no
call is due, rewarded when none is decoded)."""


def tasks_from_record(record: dict, index: int, source: str = "jsonl", turns: str = "all") -> list[FCTask]:
    """The tasks in one JSONL record (see the module docstring for the accepted shapes; `turns`: `TURNS`)."""
    if not isinstance(record, dict):
        raise ValueError(f"record {index} is not a JSON object")
    tools = [tool_doc(t) for t in parse_json_field(record.get("tools", []), f"record {index} 'tools'") or []]
    rid = str(record.get("id", index))
    # datagen's rows carry BFCL multi-turn ground truth (lists of call strings per turn): read their chat
    multi_turn_truth = isinstance(record.get("ground_truth"), list) and all(
        isinstance(t, list) and all(isinstance(c, str) for c in t) for t in record["ground_truth"]
    )
    if ("ground_truth" in record and not multi_turn_truth) or "answers" in record:
        truth = (
            parse_json_field(record.get("ground_truth", record.get("answers")), f"record {index} ground truth") or []
        )
        truth = truth if _is_possible_answer(truth) else exact_ground_truth(truth, tools)
        if "messages" in record:
            messages = [m for m in record["messages"] if m.get("role") in ("system", "user")]
        elif "query" in record:
            messages = [{"role": "user", "content": record["query"]}]
        else:
            raise ValueError(f"record {index} has neither 'messages' nor 'query'")
        return [FCTask(rid, messages, tools, truth, source)]
    if "messages" not in record:
        raise ValueError(f"record {index} has no 'messages' and no ground truth ('ground_truth' or 'answers')")
    tasks: list[FCTask] = []
    history: list[dict] = []
    for message in record["messages"]:
        # a task per assistant answer to a user message (``every``: to a tool result too)
        after = ("user", "tool") if turns == "every" else ("user",)
        if message.get("role") == "assistant" and history and history[-1].get("role") in after:
            truth = exact_ground_truth(_calls_of(message), tools)
            thought = message.get("thinking") or _think_text(message.get("content"))
            tasks.append(FCTask(f"{rid}-{len(tasks)}", list(history), tools, truth, source, thought))
            if turns == "first":
                break
        history.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "name")})
    return tasks


def _think_text(content: Any) -> str | None:
    found = re.search(r"<think>(.*?)</think>", content, re.DOTALL) if isinstance(content, str) else None
    return found[1].strip() if found and found[1].strip() else None


def load_jsonl(path: str | Path, limit: int | None = None, source: str | None = None) -> list[FCTask]:
    """Tasks from a JSONL file (datagen's output, xLAM/APIGen-style, or explicit ground truth)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    tasks: list[FCTask] = []
    for number, record in read_jsonl(path):
        try:
            tasks.extend(tasks_from_record(record, number - 1, source or path.stem))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}:{number}: {err}") from None
        if limit and len(tasks) >= limit:
            return tasks[:limit]
    return tasks
