"""datagen.export: OpenAI messages + tools (loads in `datasets`, trains in TRL's SFTTrainer), ShareGPT, dataset card."""

from __future__ import annotations

import ast
import json
import re

import pytest

from palaestra.shared.config import TrackingConfig


@pytest.fixture(scope="module")
def exported(deterministic_run):
    from palaestra.datagen.export import ExportConfig, export
    from palaestra.shared.tracking import Tracker

    path, _ = deterministic_run
    cfg = ExportConfig(input=str(path), tracking=TrackingConfig(enabled=False))
    result = export(cfg, Tracker(cfg.tracking))
    return path, path.parent / "export", result


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _load_jsonl(path) -> list[dict]:
    """Rows as a trainer gets them: through `datasets` when installed, else arrow's JSON reader (what it uses)."""
    try:
        import datasets
    except ImportError:
        from pyarrow import json as pa_json

        return pa_json.read_json(str(path)).to_pylist()
    return list(datasets.load_dataset("json", data_files=str(path), split="train"))


def _executed_calls(row) -> list[tuple[str, dict]]:
    """The calls the generator executed (the trace it recorded), in order."""
    return [(s["name"], s["arguments"]) for turn in json.loads(row["provenance"]["trace"]) for s in turn["steps"]]


def test_openai_export_loads_in_datasets_with_tools_as_a_list(exported):
    source, out, result = exported
    loaded = _load_jsonl(out / "openai.jsonl")
    rows = _rows(source)
    assert len(loaded) == len(rows) == result["samples"]
    floats = 0
    for rec, row in zip(loaded, rows):
        assert isinstance(rec["tools"], list) and rec["tools"][0]["type"] == "function"
        names = {t["function"]["name"] for t in rec["tools"]}
        assert names == {t["function"]["name"] for t in json.loads(row["tools"])}
        # arguments a JSON string, as OpenAI's API has them: loaded, they equal what ran, to the last digit
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in rec["messages"]
            for c in (m.get("tool_calls") or [])
        ]
        assert calls == _executed_calls(row)
        floats += sum(isinstance(v, float) for _, a in calls for v in a.values())
        assert [m["role"] for m in rec["messages"]] == [m["role"] for m in row["messages"]]
        # every call is one of the row's BFCL ground-truth calls (parsed here from their strings)
        truth = set()
        for turn in row["ground_truth"]:
            for call in turn:
                node = ast.parse(call, mode="eval").body
                args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                truth.add((node.func.id, json.dumps(args, sort_keys=True)))
        assert {(n, json.dumps(a, sort_keys=True)) for n, a in calls} <= truth
    assert floats > 0  # the fixture has float arguments, so the exact equality above tests something


def test_float_arguments_survive_loading_exactly(tmp_path):
    """0.924602 loads as 0.924602 from the export; as an object, arrow may read 0.9246019999999999."""
    from palaestra.datagen.export import openai_record

    values = [0.924602, 13.248935000000001, 1e-7, 2.5, 100.0]
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": json.dumps({"x": values[0]})}}
    rows = []
    for i, v in enumerate(values):
        c = {**call, "function": {"name": "f", "arguments": json.dumps({"x": v, "y": "a"})}}
        row = {
            "id": f"r{i}",
            "provenance": {"env": "E"},
            "tools": "[]",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [c]},
                {"role": "tool", "content": "{}", "tool_call_id": "c0", "name": "f"},
            ],
        }
        rows.append(openai_record(row))
    path = tmp_path / "openai.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = [json.loads(r["messages"][1]["tool_calls"][0]["function"]["arguments"])["x"] for r in _load_jsonl(path)]
    assert loaded == values
    # the control: the same calls with arguments as objects (the old export) do not all load as executed
    for r in rows:
        fn = r["messages"][1]["tool_calls"][0]["function"]
        fn["arguments"] = json.loads(fn["arguments"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    as_objects = [r["messages"][1]["tool_calls"][0]["function"]["arguments"]["x"] for r in _load_jsonl(path)]
    if as_objects == values:
        pytest.skip("this arrow reads nested doubles exactly; the string form is still exact")
    assert as_objects != values


def test_sharegpt_export_alternates_roles(exported):
    _, out, _ = exported
    for rec in _rows(out / "sharegpt.jsonl"):
        turns = rec["conversations"]
        assert turns[0]["from"] == "human"
        for i, t in enumerate(turns):
            # LLaMA-Factory: human / observation at even positions, gpt / function_call at odd ones
            assert t["from"] in (("human", "observation") if i % 2 == 0 else ("gpt", "function_call")), (i, turns)
            if t["from"] == "function_call":
                json.loads(t["value"])
        assert isinstance(json.loads(rec["tools"]), list)


def test_dataset_card_is_written(exported):
    source, out, _ = exported
    card = (out / "README.md").read_text()
    rows = _rows(source)
    assert card.startswith("---\nlicense: apache-2.0")
    assert f"samples: {len(rows)};" in card
    assert "## Contamination check" in card and f"checked {len(rows)} samples: 0 contaminated" in card
    for env in {r["provenance"]["env"] for r in rows}:
        assert env in card
    assert "ungrounded kept samples: 0" in card
    # no path of the machine that made it: not the source's, not any absolute one
    assert str(source.parent) not in card and str(source.parent.parent.parent) not in card
    assert not re.search(r"(?<![\w.])/(tmp|home|work|root|Users|var|mnt|data)/", card), card


@pytest.mark.slow
def test_trl_sft_trainer_takes_the_export(exported, tmp_path):
    """One TRL SFTTrainer step on the embedded tiny model, straight from openai.jsonl."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    from palaestra.shared.llm.tiny import build_tiny

    _, out, _ = exported
    ds = datasets.load_dataset("json", data_files=str(out / "openai.jsonl"), split="train").select(range(2))
    ds = ds.remove_columns(["id", "env"])
    model, tokenizer = build_tiny(0)
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=1,
        report_to=[],
        max_length=None,  # the tools block alone is thousands of the tiny tokenizer's tokens
        assistant_only_loss=True,
        use_cpu=True,
        save_strategy="no",
        dataset_num_proc=1,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    result = trainer.train()
    assert result.training_loss > 0
