"""datagen.export: OpenAI messages + tools (loads in `datasets`, trains in TRL's SFTTrainer), ShareGPT, dataset card."""

from __future__ import annotations

import ast
import json

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


def _approx(value):
    """Floats to 9 significant digits, recursively (arrow's JSON reader is not exact to the last digits)."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_approx(v) for v in value)
    return value


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_openai_export_loads_in_datasets_with_tools_as_a_list(exported):
    import datasets

    source, out, result = exported
    ds = datasets.load_dataset("json", data_files=str(out / "openai.jsonl"), split="train")
    rows = _rows(source)
    assert len(ds) == len(rows) == result["samples"]
    for rec, row in zip(ds, rows):
        assert isinstance(rec["tools"], list) and rec["tools"][0]["type"] == "function"
        names = {t["function"]["name"] for t in rec["tools"]}
        assert names == {t["function"]["name"] for t in json.loads(row["tools"])}
        # the chat's calls, arguments now objects, are the source row's (JSON strings there), in order
        calls = [
            (c["function"]["name"], {k: v for k, v in c["function"]["arguments"].items() if v is not None})
            for m in rec["messages"]
            for c in (m.get("tool_calls") or [])
        ]
        source_calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in row["messages"]
            for c in (m["tool_calls"] or [])
        ]
        assert _approx(calls) == _approx(source_calls)  # arrow's JSON reader may move a double's last digit
        assert [m["role"] for m in rec["messages"]] == [m["role"] for m in row["messages"]]
        # every call is one of the row's BFCL ground-truth calls (parsed here from their strings)
        truth = set()
        for turn in row["ground_truth"]:
            for call in turn:
                node = ast.parse(call, mode="eval").body
                args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                truth.add((node.func.id, json.dumps(args, sort_keys=True)))
        assert {(n, json.dumps(a, sort_keys=True)) for n, a in _approx(source_calls)} <= {
            (n, json.dumps(a, sort_keys=True)) for n, a in _approx([(n, json.loads(a)) for n, a in truth])
        }


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
