"""The papers' data (issue 36): caps count records (a seeded random subset, not file order), every assistant message
of a multi-turn record as a task with its history (``turns: every``, HardGen's split), irrelevance steps rewarded
1 when no call is decoded, the data report's multi-turn share, and a hub error that names the set. Fixtures only:
nothing downloads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from palaestra.egpo.public_data import load_public

DATA = Path(__file__).parent / "data" / "public"
FUNREASON = str(DATA / "bfcl_multi_turn.json")  # 2 records: user, call, result, text, user, 2 calls, results, text


def test_a_cap_counts_records_and_draws_them_at_random(tmp_path):
    # a 10-record file: records 0..9, one task each
    rows = [{"id": i, "query": f"q{i}", "tools": [], "answers": []} for i in range(10)]
    path = tmp_path / "ten.json"
    path.write_text(json.dumps(rows))
    tasks, stats = load_public(str(path), format="xlam", limit=3, seed=0)
    assert (stats["records_in_source"], stats["records"], stats["tasks"]) == (10, 3, 3)
    chosen = {seed: [t.id for t in load_public(str(path), format="xlam", limit=3, seed=seed)[0]] for seed in range(8)}
    assert chosen[0] == [t.id for t in tasks]  # seeded: the same subset again
    assert len({tuple(v) for v in chosen.values()}) > 1  # another seed, another subset
    assert any(v != ["ten.json/0", "ten.json/1", "ten.json/2"] for v in chosen.values())  # not the file's first lines
    assert all(v == sorted(v, key=lambda i: int(i.rsplit("/", 1)[1])) for v in chosen.values())  # in file order
    # on the multi-turn fixture a cap of 2 reads both records (it used to stop after the first record's 2 tasks)
    _, stats = load_public(FUNREASON, limit=2)
    assert (stats["records"], stats["tasks"]) == (2, 4)


def test_every_assistant_message_is_a_task_with_its_history():
    first, _ = load_public(FUNREASON, turns="first")
    answers, _ = load_public(FUNREASON, turns="all")
    every, stats = load_public(FUNREASON, turns="every")
    # per record: 1 (first), 2 answers to a user message (all), 4 assistant messages (every)
    assert (len(first), len(answers), len(every)) == (2, 4, 8)
    roles = [[m["role"] for m in t.messages] for t in every[:4]]
    assert roles == [
        ["user"],
        ["user", "assistant", "tool"],  # reads the tool result, then answers in text
        ["user", "assistant", "tool", "assistant", "user"],
        ["user", "assistant", "tool", "assistant", "user", "assistant", "tool", "tool"],
    ]
    assert every[1].ground_truth == [] and every[3].ground_truth == []  # text answers: no call due
    assert every[2].ground_truth == answers[1].ground_truth
    # the data report: 6 of 8 tasks carry an earlier answer or a tool result
    assert (stats["records"], stats["tasks"], stats["multi_turn_tasks"], stats["multi_turn_share"]) == (2, 8, 6, 0.75)
    with pytest.raises(ValueError, match="invalid value for 'turns'"):
        load_public(FUNREASON, turns="each")


@pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")
def test_a_step_where_no_call_is_due_pays_when_no_call_is_decoded():
    from palaestra.egpo.reward import fc_binary

    every, _ = load_public(FUNREASON, turns="every")
    done = every[1]  # after the tool result: the answer is text
    assert fc_binary(done, "<think>The folder is open.</think>I am in the reports folder now.")[0] == 1.0
    call = '<think>again</think>\n<tool_call>\n{"name": "cd", "arguments": {"folder": "reports"}}\n</tool_call>'
    assert fc_binary(done, call)[0] == 0.0  # a call where none is due


def test_a_missing_hub_set_is_named_and_gated_sets_say_how_to_get_access(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from palaestra.egpo.public_files import hub_files

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        hub_files("Salesforce/xlam-function-calling-60k", cache_dir=str(tmp_path))
    message = str(err.value)
    assert "Salesforce/xlam-function-calling-60k" in message and "HF_HUB_OFFLINE" in message
    assert "gated" in message and "huggingface.co/datasets/Salesforce/xlam-function-calling-60k" in message
    with pytest.raises(FileNotFoundError) as err:
        hub_files("Bingguang/HardGen", cache_dir=str(tmp_path))
    assert "Bingguang/HardGen" in str(err.value) and "gated" not in str(err.value)  # not a gated set
