"""Loaders: datagen-style chats, xLAM/APIGen JSONL, explicit ground truth, BFCL data; bad input."""

from __future__ import annotations

import json

import pytest

from palaestra.egpo.fc_tasks import fc_tasks
from palaestra.egpo.reward import fc_binary
from palaestra.egpo.tasks import canonical_calls, exact_ground_truth, load_jsonl
from palaestra.shared.toolcall import ToolCall, format_calls

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "default": "C"}},
            "required": ["city"],
        },
    },
}


def write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_openai_chat_records_become_one_task_per_user_turn(tmp_path):
    record = {
        "id": "d1",
        "tools": [TOOL],
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "Weather in Rome?"},
            {
                "role": "assistant",
                "content": "<think>x</think>",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You're welcome."},
        ],
    }
    tasks = load_jsonl(write(tmp_path / "d.jsonl", [record]))
    assert [t.ground_truth for t in tasks] == [[{"get_weather": {"city": ["Rome"], "unit": ["", "C"]}}], []]
    assert tasks[1].messages[-1] == {"role": "user", "content": "Thanks!"}
    answer = format_calls([ToolCall("get_weather", {"city": "Rome", "unit": "C"})], thinking="t")
    assert fc_binary(tasks[0], answer)[0] == 1.0


def test_xlam_and_explicit_records(tmp_path):
    xlam = {
        "query": "Weather in Oslo?",
        "tools": json.dumps([TOOL["function"]]),
        "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Oslo"}}]),
    }
    explicit = {
        "messages": [{"role": "user", "content": "Oslo or Lima?"}],
        "tools": [TOOL],
        "ground_truth": [{"get_weather": {"city": ["Oslo", "Lima"]}}],
    }
    tasks = load_jsonl(write(tmp_path / "x.jsonl", [xlam, explicit]))
    assert tasks[0].messages == [{"role": "user", "content": "Weather in Oslo?"}]
    assert canonical_calls(tasks[0].ground_truth) == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert tasks[1].ground_truth == [{"get_weather": {"city": ["Oslo", "Lima"]}}]


def test_bad_files_give_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="task file not found"):
        load_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not valid JSON"):
        load_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="neither 'messages' nor 'query'"):
        load_jsonl(write(tmp_path / "b.jsonl", [{"tools": [], "answers": []}]))
    with pytest.raises(ValueError, match="no tasks"):
        fc_tasks()


def test_exact_ground_truth_accepts_defaults():
    truth = exact_ground_truth([{"name": "get_weather", "arguments": {"city": "Rome"}}], [TOOL])
    assert truth == [{"get_weather": {"city": ["Rome"], "unit": ["", "C"]}}]


def test_fc_tasks_samples_with_answers_score_one():
    for compact in (False, True):
        samples = fc_tasks(synthetic=8, with_answers=True, compact_tools=compact)
        for sample in samples:
            answer = sample["messages"][-1]["content"]
            prompt_only = {**sample, "messages": sample["messages"][:-1]}
            assert fc_binary(prompt_only, answer)[0] == 1.0, (sample["id"], answer)


def test_datagen_rows(tmp_path):
    """A row in the schema of palaestra.datagen.dataset (tools as a JSON string, BFCL multi-turn truth)."""
    tool = {
        "type": "function",
        "function": {
            "name": "edit_ticket",
            "description": "Edit.",
            "parameters": {
                "type": "object",
                "properties": {"ticket_id": {"type": "integer"}, "updates": {"type": "object"}},
                "required": ["ticket_id", "updates"],
            },
        },
    }
    call = {
        "id": "c0",
        "type": "function",
        "function": {"name": "edit_ticket", "arguments": json.dumps({"ticket_id": 1, "updates": {"priority": 3}})},
    }
    row = {
        "id": "dg-s0-r0-0",
        "tools": json.dumps([tool]),
        "ground_truth": [["edit_ticket(ticket_id=1, updates={'priority': 3})"]],
        "messages": [
            {
                "role": "user",
                "content": "Raise ticket 1 to priority 3.",
                "tool_calls": None,
                "tool_call_id": None,
                "name": None,
            },
            {
                "role": "assistant",
                "content": "<think>edit</think>",
                "tool_calls": [call],
                "tool_call_id": None,
                "name": None,
            },
            {"role": "tool", "content": "{}", "tool_calls": None, "tool_call_id": "c0", "name": "edit_ticket"},
            {
                "role": "assistant",
                "content": "<think>ok</think>Done.",
                "tool_calls": None,
                "tool_call_id": None,
                "name": None,
            },
        ],
    }
    (task,) = load_jsonl(write(tmp_path / "samples.jsonl", [row]))
    answer = format_calls([ToolCall("edit_ticket", {"ticket_id": 1, "updates": {"priority": 3}})], thinking="t")
    assert fc_binary(task, answer)[0] == 1.0
    wrong = format_calls([ToolCall("edit_ticket", {"ticket_id": 1, "updates": {"priority": 2}})], thinking="t")
    assert fc_binary(task, wrong)[0] == 0.0
