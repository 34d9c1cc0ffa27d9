"""The public function-calling training sets as `FCTask`s, read from a local file or the Hugging Face hub cache.

Formats (each recognised from its first record with ``format: auto``; where the layout was read is given, since
the loaders must not guess):

- ``xlam``: Salesforce/xlam-function-calling-60k (and the APIGen single-turn sets): a JSON array of
  ``{"id", "query", "tools", "answers"}``, ``tools`` and ``answers`` JSON strings (or lists). A tool's
  ``parameters`` map each name to ``{"type", "description", "default"?}`` with Python type names
  (``"str"``, ``"List[int]"``, ``"float, optional"``), not JSON schema: converted here (``, optional`` -> not
  required). Layout: the dataset card (huggingface.co/datasets/Salesforce/xlam-function-calling-60k) and NVIDIA
  NeMo Automodel's xLAM guide (``docs/guides/llm/toolcalling.md``, ``make_xlam_dataset``).
- ``apigen_mt``: Salesforce/APIGen-MT-5k: ShareGPT rows ``{"conversations": [{"from", "value"}], "system",
  "tools"}``, ``from`` in human / gpt / function_call / observation, a function_call's value a JSON
  ``{"name", "arguments"}``; the calls of the ``think`` tool are the agent's reasoning, not actions, and are
  dropped with their observation. Layout: the converter of a public SFT script (``_convert_apigen``: "Schema:
  {conversations: [{from, value}], system, tools}") and the card of tuandunghcmut/apigen-mt-5k (roles
  human -> user, gpt -> assistant, function_call -> assistant with tool_calls, observation -> tool; think calls).
- ``funreason_mt`` (Bingguang/FunReason-MT, file ``bfcl_multi_turn.json``) and ``hardgen`` (Bingguang/HardGen,
  same authors and pipeline, its card carries the same ``error_tool_response`` note): a record maps ``"0"``,
  ``"1"``, ... to messages; ``"0"`` holds ``tools`` (a list or its Python repr), the others ``{"role",
  "content"}``; an assistant's content is optional ``<think>...</think>`` text then BFCL's Python call list
  ``[f(a=1), g(b='x')]``; a tool message's content a list of ``{call: result}``. ``error_tool_response: true``
  marks trajectories with deliberately wrong environment responses (``drop_error_responses``). Layout: the
  dataset cards (the flag) and a public training script that reads this file (``convert_to_openai``: key
  ``"0"`` with ``tools``, digit keys with ``role`` / ``content``, the call list parsed from the content's end).
  Neither card documents the schema itself: these two loaders are the least certain here.

Multi-turn records give a task per assistant answer to a user message (`palaestra.egpo.tasks.tasks_from_record`),
or only the first (``turns: first``). `public_fc_tasks` (task source, registered lazily in `palaestra.egpo.tasks`)
mixes several sources and runs them through BFCL's contamination check (`palaestra.egpo.contamination`) first.
A source path is a local ``.json`` / ``.jsonl`` file, a folder of them, or ``hf://datasets/<org>/<name>[/<file>]``
read through ``huggingface_hub`` (its cache; ``HF_HUB_OFFLINE=1`` reads the cache only).
"""

from __future__ import annotations

import ast
import json
import random
import re
from pathlib import Path
from typing import Any

from palaestra.egpo.bfcl_contamination import BfclQueryIndex
from palaestra.egpo.public_files import hub_files, read_records, resolve_files  # noqa: F401  (their home)
from palaestra.egpo.tasks import TURNS, FCTask, tasks_from_record, tool_doc

FORMATS = ("auto", "xlam", "apigen_mt", "funreason_mt", "hardgen", "palaestra")
_PY_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "object"}
_SEQUENCES = ("list", "tuple", "set", "sequence")


# ---- formats ------------------------------------------------------------------------------------------------


def detect_format(record: Any) -> str:
    """The format of one record (see the module docstring)."""
    if isinstance(record, dict):
        if "conversations" in record:
            return "apigen_mt"
        if "query" in record and "answers" in record:
            return "xlam"
        if "0" in record and "1" in record:
            return "funreason_mt"
        if "messages" in record or "ground_truth" in record:
            return "palaestra"
    raise ValueError(f"unrecognised record (keys {sorted(record)[:8] if isinstance(record, dict) else type(record)})")


def xlam_tool(tool: dict) -> dict:
    """An xLAM tool (Python type names, ``, optional``) as a JSON-schema function doc."""
    props, required = {}, []
    for pname, spec in (tool.get("parameters") or {}).items():
        spec = dict(spec) if isinstance(spec, dict) else {"type": str(spec)}
        raw = str(spec.get("type", "")).strip()
        optional = raw.lower().endswith("optional")
        base = re.sub(r",?\s*optional$", "", raw, flags=re.I).strip()
        spec["type"] = _json_type(base)
        props[pname] = spec
        if not optional:
            required.append(pname)
    parameters = {"type": "object", "properties": props, "required": required}
    return {"name": tool["name"], "description": tool.get("description", ""), "parameters": parameters}


def _json_type(python_type: str) -> str:
    head = python_type.split("[")[0].strip().lower()
    if head in _SEQUENCES:
        return "array"
    return _PY_TYPES.get(head, python_type)  # an unknown type stays as written (compared by equality)


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def xlam_tasks(record: dict, index: int, source: str, turns: str = "all") -> list[FCTask]:
    tools = [xlam_tool(t) for t in _loads(record["tools"]) or []]
    answers = [
        {"name": a["name"], "arguments": _loads(a.get("arguments", {}))} for a in _loads(record["answers"]) or []
    ]
    row = {"id": record.get("id", index), "query": record["query"], "tools": tools, "answers": answers}
    return tasks_from_record(row, index, source)


def apigen_mt_messages(record: dict) -> list[dict]:
    """APIGen-MT's ShareGPT turns as OpenAI-style messages, the ``think`` tool's calls and results dropped."""
    messages: list[dict] = []
    skip_observation, thought = False, None
    for turn in record["conversations"]:
        role, value = turn.get("from"), turn.get("value", "")
        if role == "function_call":
            call = _loads(value)
            if call.get("name") == "think":  # the reasoning of the next action
                skip_observation, thought = True, (call.get("arguments") or {}).get("thought")
                continue
            tool_call = {"function": {"name": call["name"], "arguments": call.get("arguments", {})}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(tool_call)  # consecutive calls: one message
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call], "thinking": thought})
            skip_observation, thought = False, None
        elif role == "observation":
            if not skip_observation:
                messages.append({"role": "tool", "content": value})
            skip_observation = False
        else:
            messages.append({"role": {"human": "user", "gpt": "assistant"}.get(role, role), "content": value})
    return messages


def apigen_mt_tasks(record: dict, index: int, source: str, turns: str = "all") -> list[FCTask]:
    from palaestra.egpo.tasks import SYSTEM_PROMPT

    tools = [t for t in _loads(record.get("tools", [])) or [] if tool_doc(t).get("name") != "think"]
    messages = apigen_mt_messages(record)
    if record.get("system"):  # the domain's policy stays; our format instructions come first
        messages = [{"role": "system", "content": f"{SYSTEM_PROMPT}\n\n{record['system']}"}, *messages]
    row = {"id": record.get("id", index), "messages": messages, "tools": tools}
    return tasks_from_record(row, index, source, turns)


def python_calls(text: str) -> tuple[str, list[dict]] | None:
    """BFCL's Python call list at the end of `text` (after any ``</think>``): ``(text before, calls)``; None if
    the text does not end in one (a plain answer)."""
    body = text.split("</think>")[-1].strip()
    for start in [m.start() for m in re.finditer(r"\[", body)]:
        try:
            tree = ast.parse(body[start:], mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(tree, ast.List) or not all(isinstance(e, ast.Call) for e in tree.elts):
            continue
        calls = []
        for call in [e for e in tree.elts if isinstance(e, ast.Call)]:
            if call.args:
                raise ValueError(f"positional arguments in {ast.unparse(call)!r} (BFCL calls take keywords)")
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
            calls.append({"name": ast.unparse(call.func), "arguments": kwargs})
        return body[:start].strip(), calls
    return None


def funreason_messages(record: dict) -> tuple[list[dict], list[dict]]:
    """A FunReason-MT / HardGen record as (OpenAI-style messages, function docs)."""
    keys = sorted((k for k in record if k.isdigit()), key=int)
    head = record[keys[0]] or {}
    tools = head.get("tools", [])
    tools = ast.literal_eval(tools) if isinstance(tools, str) else tools
    messages: list[dict] = []
    for key in keys[1:]:
        message = record[key] or {}
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant":
            parsed = python_calls(content)
            thought = content.split("</think>")[0].split("<think>")[-1].strip() if "</think>" in content else None
            if parsed is None:
                text = content.split("</think>")[-1].strip()
                messages.append({"role": "assistant", "content": text, "thinking": thought})
            else:
                calls = [{"function": c} for c in parsed[1]]
                messages.append({"role": "assistant", "content": parsed[0], "tool_calls": calls, "thinking": thought})
        elif role == "tool":
            results = ast.literal_eval(content) if isinstance(content, str) else content
            for result in results if isinstance(results, list) else [results]:
                messages.append({"role": "tool", "content": json.dumps(result, default=str)})
        elif role in ("user", "system"):
            messages.append({"role": role, "content": content})
    return messages, [tool_doc(t) for t in tools]


def funreason_tasks(record: dict, index: int, source: str, turns: str = "all") -> list[FCTask]:
    messages, tools = funreason_messages(record)
    row = {"id": record.get("id", index), "messages": messages, "tools": tools}
    return tasks_from_record(row, index, source, turns)


CONVERTERS = {
    "xlam": xlam_tasks,
    "apigen_mt": apigen_mt_tasks,
    "funreason_mt": funreason_tasks,
    "hardgen": funreason_tasks,
    "palaestra": tasks_from_record,
}


def load_public(
    path: str,
    format: str = "auto",
    limit: int | None = None,
    turns: str = "all",
    drop_error_responses: bool = False,
    cache_dir: str | None = None,
    source: str | None = None,
    seed: int = 0,
) -> tuple[list[FCTask], dict[str, int]]:
    """Tasks of one source and its counts (``records``, ``tasks``, ``multi_turn_tasks``, ``skipped`` records and
    why). `limit` caps records, not tasks: a seeded random subset (`seed`) of them, in file order; `turns`: which
    assistant messages of a record are tasks (`palaestra.egpo.tasks.TURNS`)."""
    if format not in FORMATS:
        raise ValueError(f"invalid value for 'format': {format!r} ({' | '.join(FORMATS)})")
    if turns not in TURNS:
        raise ValueError(f"invalid value for 'turns': {turns!r} ({' | '.join(TURNS)})")
    name = source or path.rstrip("/").split("/")[-1]
    records = [(file, i, r) for file in resolve_files(path, cache_dir) for i, r in enumerate(read_records(file))]
    stats: dict[str, Any] = {"records_in_source": len(records), "records": 0, "tasks": 0, "skipped": 0}
    stats["error_responses_dropped"] = 0
    if limit and limit < len(records):
        keep = sorted(random.Random(f"{seed}:{name}").sample(range(len(records)), limit))
        records = [records[k] for k in keep]
    tasks: list[FCTask] = []
    for file, index, record in records:
        stats["records"] += 1
        if drop_error_responses and isinstance(record, dict) and record.get("error_tool_response"):
            stats["error_responses_dropped"] += 1
            continue
        kind = detect_format(record) if format == "auto" else format
        try:
            found = CONVERTERS[kind](record, index, name, turns)
        except (KeyError, TypeError, ValueError, SyntaxError) as err:
            stats["skipped"] += 1
            stats.setdefault("first_skip", f"{file.name} record {index}: {type(err).__name__}: {err}")
            continue
        for task in found:
            task.id = f"{name}/{task.id}"
            tasks.append(task)
    stats["tasks"] = len(tasks)
    # a multi-turn task: its prompt holds an earlier answer of the assistant or a tool result
    stats["multi_turn_tasks"] = sum(any(m.get("role") in ("assistant", "tool") for m in t.messages) for t in tasks)
    stats["multi_turn_share"] = stats["multi_turn_tasks"] / len(tasks) if tasks else 0.0
    return tasks, stats


def public_fc_tasks(
    sources: list[dict[str, Any]],
    contamination: str = "drop",
    report_path: str | None = None,
    with_answers: bool = False,
    max_tools: int = 0,
    think_args: bool = False,
    source_thoughts: bool = False,
    min_args: int = 0,
    seed: int = 0,
) -> list[dict]:
    """Task source: the tasks of several sources (each ``{path, format?, limit?, turns?, drop_error_responses?,
    name?}``, see `load_public`) as samples for the ``task`` env and SFT (`palaestra.egpo.fc_tasks.task_sample`).

    Before anything is returned, every task's user turns go through BFCL's contamination check
    (`palaestra.egpo.bfcl_contamination`: a shared word 8-gram with any BFCL v4 test question): ``drop``
    (default) removes the hits, ``report`` keeps them, ``off`` skips the check. What the check found, per source,
    is printed and, with ``report_path``, written there as JSON.

    ``source_thoughts``: an answer of ``with_answers`` thinks what the source's own reasoning says (datagen's,
    FunReason-MT's, APIGen-MT's think tool) where the task has it, instead of the one-line reference thought.
    ``min_args``, ``max_tools``, ``think_args``: as in ``fc_tasks``.

    The samples are built once per process and set of arguments: the trainer builds a task env per episode.
    `public_fc_report` gives what the check found for the same arguments."""
    stamps = [_stamp(str(spec.get("path", ""))) for spec in sources]  # a local file rewritten is read again
    key = json.dumps([sources, stamps, contamination, report_path, with_answers, max_tools, think_args,
                      source_thoughts, min_args, seed], sort_keys=True, default=str)  # fmt: skip
    if key not in _SAMPLES:
        _SAMPLES[key] = _public_fc_tasks(
            sources, contamination, report_path, with_answers, max_tools, think_args, source_thoughts, min_args, seed
        )
    return _SAMPLES[key][0]


_SAMPLES: dict[str, tuple[list[dict], dict[str, Any]]] = {}


def public_fc_report(**source_kwargs: Any) -> dict[str, Any]:
    """The contamination report (per source: checked, contaminated, kept, examples) of ``public_fc_tasks`` called
    with these arguments; builds the samples if this process has not yet (they are cached for the trainer)."""
    samples = public_fc_tasks(**source_kwargs)
    report = next(r for s, r in _SAMPLES.values() if s is samples)
    return {**report, "samples": len(samples)}


def _stamp(path: str) -> list[int]:
    local = Path(path).expanduser()
    files = sorted(local.rglob("*")) if local.is_dir() else [local] if local.is_file() else []
    return [v for f in files for v in (f.stat().st_mtime_ns, f.stat().st_size)]


def _public_fc_tasks(
    sources: list[dict[str, Any]],
    contamination: str,
    report_path: str | None,
    with_answers: bool,
    max_tools: int,
    think_args: bool,
    source_thoughts: bool,
    min_args: int,
    seed: int,
) -> tuple[list[dict], dict[str, Any]]:
    from palaestra.egpo.fc_tasks import subset_tools
    from palaestra.egpo.tasks import canonical_calls

    if contamination not in ("drop", "report", "off"):
        raise ValueError(f"invalid value for 'contamination': {contamination!r} (drop | report | off)")
    if not sources:
        raise ValueError("public_fc_tasks: no sources")
    index = BfclQueryIndex.from_bfcl() if contamination != "off" else None
    report: dict[str, Any] = {"contamination": contamination, "sources": {}}
    tasks: list[FCTask] = []
    for spec in sources:
        spec = dict(spec)
        name = spec.pop("name", None) or spec["path"].rstrip("/").split("/")[-1]
        spec.setdefault("seed", seed)
        found, stats = load_public(source=name, **spec)
        if index is not None:
            hits = index.task_hits(found)
            stats.update(index.summary(found, hits))
            if contamination == "drop":
                found = [t for t in found if t.id not in hits]
        stats["kept"] = len(found)
        report["sources"][name] = stats
        print(f"public_fc_tasks: {name}: {json.dumps(stats, default=str)}", flush=True)
        tasks += found
    parts = report["sources"].values()
    totals = {k: sum(p.get(k, 0) for p in parts) for k in ("records", "tasks", "multi_turn_tasks", "kept")}
    report["totals"] = {**totals, "multi_turn_share": totals["multi_turn_tasks"] / max(totals["tasks"], 1)}
    print(f"public_fc_tasks: all sources: {json.dumps(report['totals'])}", flush=True)
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(report, indent=1, default=str))
    if not tasks:
        raise ValueError("public_fc_tasks: no tasks left")
    if min_args:
        given = {t.id: [len(c["arguments"]) for c in canonical_calls(t.ground_truth, t.tools)] for t in tasks}
        tasks = [t for t in tasks if given[t.id] and min(given[t.id]) >= min_args]
    if max_tools:
        tasks = [subset_tools(t, max_tools, seed) for t in tasks]
    return [_sample(t, with_answers, think_args, source_thoughts) for t in tasks], report


def _sample(task: FCTask, with_answer: bool, think_args: bool, source_thoughts: bool) -> dict:
    from palaestra.egpo.fc_tasks import task_sample
    from palaestra.egpo.tasks import canonical_calls
    from palaestra.shared.toolcall import ToolCall, format_calls

    if not (with_answer and source_thoughts and task.thinking):
        return task_sample(task, with_answer, think_args=think_args)
    sample = task_sample(task)
    calls = [ToolCall(c["name"], c["arguments"]) for c in canonical_calls(task.ground_truth, task.tools)]
    content = "" if calls else "I cannot help with that using these tools."
    text = format_calls(calls, thinking=task.thinking, content=content)
    return {**sample, "messages": [*sample["messages"], {"role": "assistant", "content": text}]}
