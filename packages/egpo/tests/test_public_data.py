"""Loaders of the public training sets on fixture files written in each release's layout, the hub cache path,
and BFCL's contamination check before training."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from palaestra.egpo.public_data import load_public, public_fc_tasks, python_calls, xlam_tool
from palaestra.egpo.reward import judge_completion
from palaestra.shared.toolcall import ToolCall, format_calls

DATA = Path(__file__).parent / "data" / "public"
needs_bfcl = pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")


def answer(calls: list[tuple[str, dict]]) -> str:
    return format_calls([ToolCall(n, a) for n, a in calls], thinking="t")


def pays(task, calls) -> bool:
    return judge_completion(task, answer(calls))[0] == 1.0


def test_xlam_records_types_optional_parameters_and_answers():
    tasks, stats = load_public(str(DATA / "xlam_function_calling_60k.json"))
    assert stats["records"] == 4 and stats["tasks"] == 4 and stats["skipped"] == 0
    weather, parallel, none, _ = tasks
    assert weather.messages == [{"role": "user", "content": "What is the weather in Paris in imperial units?"}]
    params = weather.tools[0]["parameters"]
    assert params["required"] == ["city"]  # "str, optional" is not required
    assert {k: v["type"] for k, v in params["properties"].items()} == {
        "city": "string",
        "units": "string",
        "days": "integer",
    }
    assert (
        xlam_tool({"name": "f", "parameters": {"x": {"type": "List[int]"}}})["parameters"]["properties"]["x"]["type"]
        == "array"
    )
    # the reward pays the answer, and the answer without the optional parameter that keeps its default
    assert pays(weather, [("get_weather", {"city": "Paris", "units": "imperial"})])
    assert pays(weather, [("get_weather", {"city": "Paris", "units": "imperial", "days": 1})])
    assert not pays(weather, [("get_weather", {"city": "Paris"})])  # units was asked for
    assert not pays(weather, [("get_weather", {"city": "Rome", "units": "imperial"})])
    assert pays(parallel, [("mean", {"values": [1.5, 2.5, 4.0]}), ("is_prime", {"n": 97})])  # any order
    assert not pays(parallel, [("is_prime", {"n": 97})])
    assert none.ground_truth == [] and judge_completion(none, "<think>t</think>I cannot book flights.")[0] == 1.0
    assert [t.id for t in tasks][:2] == ["xlam_function_calling_60k.json/0", "xlam_function_calling_60k.json/1"]


def test_apigen_mt_conversations_without_the_think_tool():
    tasks, stats = load_public(str(DATA / "apigen-mt_5k.json"))
    assert stats["tasks"] == 2
    first, second = tasks
    assert first.ground_truth == [{"get_user_details": {"user_id": ["mia_li_3668"]}}]  # the think call is gone
    assert [t["name"] for t in first.tools] == ["get_user_details", "cancel_pending_order"]
    assert first.messages[0]["role"] == "system" and "Retail agent policy" in first.messages[0]["content"]
    assert "<think>" in first.messages[0]["content"]  # our format instructions come first
    assert second.ground_truth == [
        {"cancel_pending_order": {"order_id": ["#W5918442"], "reason": ["no longer needed"]}}
    ]
    roles = [m["role"] for m in second.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]  # history without think/obs
    assert second.messages[2]["tool_calls"][0]["function"]["name"] == "get_user_details"
    assert pays(second, [("cancel_pending_order", {"order_id": "#W5918442", "reason": "no longer needed"})])


def test_funreason_mt_and_hardgen_records():
    tasks, stats = load_public(str(DATA / "bfcl_multi_turn.json"))
    assert stats["records"] == 2 and stats["tasks"] == 4  # two user turns per record
    first, second = tasks[:2]
    assert first.ground_truth == [{"cd": {"folder": ["reports"]}}]
    assert [t["name"] for t in first.tools] == ["cd", "mkdir", "ls"]
    assert second.ground_truth[0] == {"mkdir": {"dir_name": ["drafts"]}}
    assert second.ground_truth[1]["ls"]["a"] == [True]
    roles = [m["role"] for m in second.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert json.loads(second.messages[2]["content"]) == {
        "cd(folder='reports')": "{'current_working_directory': 'reports'}"
    }
    assert pays(second, [("mkdir", {"dir_name": "drafts"}), ("ls", {"a": True})])
    # the flagged trajectory goes, and "first" keeps one task per record
    kept, stats = load_public(str(DATA / "bfcl_multi_turn.json"), drop_error_responses=True, turns="first")
    assert stats["error_responses_dropped"] == 1 and len(kept) == 1
    hardgen, stats = load_public(str(DATA / "hardgen.jsonl"), format="hardgen")
    assert [t.ground_truth for t in hardgen] == [t.ground_truth for t in tasks[:2]]
    assert python_calls("[f(x=1)] trailing") is None and python_calls("plain answer") is None
    assert python_calls("<think>a [b]</think>ok [f(x=[1, 2]), g.h(y='z')]") == (
        "ok",
        [{"name": "f", "arguments": {"x": [1, 2]}}, {"name": "g.h", "arguments": {"y": "z"}}],
    )


def test_hub_dataset_from_an_offline_cache_layout(tmp_path, monkeypatch):
    """``hf://datasets/...`` read from a Hugging Face hub cache laid out as the hub client writes it, offline."""
    pytest.importorskip("huggingface_hub")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "datasets--Salesforce--xlam-function-calling-60k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    shutil.copy(DATA / "xlam_function_calling_60k.json", repo / "snapshots" / commit / "xlam_function_calling_60k.json")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    local, _ = load_public(str(DATA / "xlam_function_calling_60k.json"))
    for spec in (
        "Salesforce/xlam-function-calling-60k",
        "Salesforce/xlam-function-calling-60k/xlam_function_calling_60k.json",
    ):
        tasks, stats = load_public(f"hf://datasets/{spec}", source="xlam")
        assert stats["records"] == 4
        assert [(t.messages, t.ground_truth) for t in tasks] == [(t.messages, t.ground_truth) for t in local]
    with pytest.raises(FileNotFoundError):  # not in the cache: offline, nothing is fetched
        load_public("hf://datasets/Salesforce/APIGen-MT-5k")


@needs_bfcl
def test_contamination_check_before_training(tmp_path, capsys):
    sources = [
        {"path": str(DATA / "xlam_function_calling_60k.json"), "name": "xlam"},
        {"path": str(DATA / "apigen-mt_5k.json")},
    ]
    report_path = tmp_path / "data_report.json"
    samples = public_fc_tasks(sources, report_path=str(report_path))
    report = json.loads(report_path.read_text())
    xlam = report["sources"]["xlam"]
    # record 3's query is BFCL simple_python's first question word for word
    assert (xlam["checked"], xlam["contaminated"], xlam["kept"]) == (4, 1, 3)
    assert xlam["examples"][0]["id"] == "xlam/3"
    assert report["sources"]["apigen-mt_5k.json"]["contaminated"] == 0
    assert len(samples) == 3 + 2 and "xlam/3" not in {s["id"] for s in samples}
    assert "public_fc_tasks: xlam:" in capsys.readouterr().out
    kept = public_fc_tasks(sources, contamination="report")
    assert len(kept) == 6
    sft = public_fc_tasks(sources[:1], with_answers=True)
    assert sft[0]["messages"][-1]["role"] == "assistant" and "<tool_call>" in sft[0]["messages"][-1]["content"]


class _NoTraining:
    """The trainer's place in ``egpo.train``, doing nothing: the check runs before it."""

    def __init__(self, cfg, tracker, eval_hook=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def prepare(self):
        pass

    def train(self):
        return {"steps": 0}


@needs_bfcl
def test_every_training_set_is_checked_and_logged_in_the_training_run(tmp_path, tracking, monkeypatch):
    """egpo.train runs the public sets (hits dropped), another task source, datagen's multi-turn rows and the SFT
    set through BFCL's contamination check before training, and logs what it found in the run (MLflow artifact
    ``data/contamination.json`` and metrics)."""
    from mlflow.tracking import MlflowClient

    from palaestra.egpo.bfcl import load_category
    from palaestra.egpo.tasks import load_bfcl
    from palaestra.shared.jobs import load_config, run_job

    # BFCL's own entries as training sets: every question of 8 words or more is a hit by definition
    rows = []
    for entry, truth in load_category("multi_turn_base", 2):
        turns = [{"kind": "normal", "query": q[0]["content"] if q else ""} for q in entry["question"]]
        row = {"turns": turns, "ground_truth": truth, "initial_config": json.dumps(entry["initial_config"]),
               "involved_classes": entry["involved_classes"], "tools": json.dumps(entry["function"])}  # fmt: skip
        rows.append(row)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    simple = load_bfcl("simple_python", 3)
    assert all(len(t.messages[-1]["content"].split()) >= 8 for t in simple)
    xlam = {"path": str(DATA / "xlam_function_calling_60k.json"), "name": "xlam"}
    apigen = {"path": str(DATA / "apigen-mt_5k.json"), "name": "apigen"}
    cfg = load_config(
        {
            "job": "egpo.train",
            "output_dir": str(tmp_path / "out"),
            "envs": [
                {"name": "task", "kwargs": {"source": "public_fc_tasks", "source_kwargs": {"sources": [xlam]}}},
                {"name": "task", "kwargs": {"source": "fc_tasks", "source_kwargs": {"bfcl_category": "simple_python",
                                                                                     "limit": 3}}},
                {"name": "datagen_multi_turn", "kwargs": {"path": str(tmp_path / "rows.jsonl")}},
                {"name": "bfcl_multi_turn", "kwargs": {}},
            ],
            "sft_warmup": {"steps": 1, "source": "public_fc_tasks",
                           "source_kwargs": {"sources": [apigen], "contamination": "report", "with_answers": True}},
            "tracking": vars(tracking),
        }
    )  # fmt: skip
    monkeypatch.setattr("palaestra.shared.rl.trainer.Trainer", _NoTraining)
    out = run_job(cfg)
    client = MlflowClient(tracking.uri)
    local = client.download_artifacts(out["run_id"], "data/contamination.json", str(tmp_path))
    sets = json.loads(Path(local).read_text())
    public = sets["envs.0.task"]
    assert (public["action"], public["checked"], public["contaminated"], public["kept"]) == ("drop", 4, 1, 3)
    assert public["sources"]["xlam"]["examples"][0]["id"] == "xlam/3"  # simple_python's first question, verbatim
    assert (sets["envs.1.task"]["action"], sets["envs.1.task"]["checked"], sets["envs.1.task"]["contaminated"]) == (
        "report",
        3,
        3,
    )
    rows_report = sets["envs.2.datagen_multi_turn"]
    assert rows_report["checked"] == 2 and rows_report["contaminated"] == 2
    assert "not checked" in sets["envs.3.bfcl_multi_turn"]["note"]
    assert (sets["sft_warmup"]["action"], sets["sft_warmup"]["contaminated"]) == ("report", 0)
    metrics = client.get_run(out["run_id"]).data.metrics
    assert metrics["data/envs.0.task/contaminated"] == 1 and metrics["data/envs.1.task/checked"] == 3
    run = run_job(load_config({"job": "egpo.train", "contamination_check": False, "tracking": vars(tracking)}))
    assert not [a.path for a in client.list_artifacts(run["run_id"], "data")]


@needs_bfcl
@pytest.mark.skipif(not importlib.util.find_spec("palaestra.datagen"), reason="datagen not installed")
def test_same_verdicts_as_datagens_query_check():
    from palaestra.datagen.contamination import ContaminationIndex
    from palaestra.egpo.bfcl_contamination import BfclQueryIndex
    from palaestra.egpo.tasks import load_bfcl

    theirs, ours = ContaminationIndex.from_bfcl(), BfclQueryIndex.from_bfcl()
    texts = [t.messages[-1]["content"] for t in load_bfcl("live_simple", 5)] + [
        "What is the weather in Paris in imperial units?",
        "Please find the area of a triangle with a base of 10 units and height of 5 units, thanks.",
    ]
    for text in texts:
        assert sorted(ours.text_hits([text])) == sorted(theirs.query_hits([text])), text
    assert ours.text_hits([texts[-1]]) and not ours.text_hits([texts[-2]])


def test_source_reasoning_is_kept_for_the_warm_start():
    from palaestra.egpo.tasks import tasks_from_record

    apigen, _ = load_public(str(DATA / "apigen-mt_5k.json"))
    assert [t.thinking for t in apigen] == ["Look up the user first.", None]  # the think tool's thought
    funreason, _ = load_public(str(DATA / "bfcl_multi_turn.json"))  # (a cap counts records since issue 36)
    assert [t.thinking for t in funreason[:2]] == ["The user wants the reports folder.", "Two calls."]
    row = {
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "<think>Use f.</think>",
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
            },
        ],
        "tools": [{"name": "f"}],
    }
    assert tasks_from_record(row, 0)[0].thinking == "Use f."  # datagen's chat rows
    sources = [{"path": str(DATA / "apigen-mt_5k.json")}]
    sft = public_fc_tasks(sources, contamination="off", with_answers=True, source_thoughts=True)
    text = sft[0]["messages"][-1]["content"]
    assert text.startswith("<think>Look up the user first.</think>")
    assert judge_completion(apigen[0], text)[0] == 1.0  # the answer still earns the reward
    plain = public_fc_tasks(sources, contamination="off", with_answers=True)[0]["messages"][-1]["content"]
    assert plain.startswith("<think>Call get_user_details")  # the one-line reference thought otherwise
    xlam = [{"path": str(DATA / "xlam_function_calling_60k.json")}]
    assert len(public_fc_tasks(xlam, contamination="off", min_args=1)) == 3  # the task with no call goes
    assert len(public_fc_tasks(xlam, contamination="off", min_args=2)) == 2  # is_prime passes one argument


def test_samples_are_built_once_per_process_and_arguments(tmp_path, capsys):
    """The trainer builds a task env (and so calls the source) per episode: the data is read once."""
    path = tmp_path / "x.json"
    shutil.copy(DATA / "xlam_function_calling_60k.json", path)
    first = public_fc_tasks([{"path": str(path)}], contamination="off")
    assert public_fc_tasks([{"path": str(path)}], contamination="off") is first
    assert capsys.readouterr().out.count("public_fc_tasks: x.json") == 1
    records = json.loads(path.read_text())[:2]
    path.write_text(json.dumps(records))  # rewritten (size changes): read again
    assert len(public_fc_tasks([{"path": str(path)}], contamination="off")) == 2
