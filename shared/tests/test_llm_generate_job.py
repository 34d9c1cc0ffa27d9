"""The ``llm.generate`` job end to end on `tiny`: JSONL output, MLflow run with metrics and artifact."""

import json
from pathlib import Path

import mlflow
import pytest

from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.llm.generate import load_prompts


def _config(tracking, tmp_path, **fields):
    data = {
        "job": "llm.generate",
        "llm": {"model": "tiny", "device": "cpu"},
        "sampling": {"temperature": 0.0, "max_tokens": 6},
        "output_dir": str(tmp_path / "out"),
        "tracking": {"experiment": tracking.experiment, "uri": tracking.uri, "artifact_root": tracking.artifact_root},
        **fields,
    }
    return load_config(data)


@pytest.mark.slow
def test_generate_job_writes_jsonl_and_logs_mlflow(tracking, tmp_path, tiny_llm):
    prompts_file = tmp_path / "prompts.jsonl"
    conv = {
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "w"}}],
    }
    prompts_file.write_text(json.dumps({"prompt": "from file"}) + "\n" + json.dumps(conv) + "\n")
    cfg = _config(tracking, tmp_path, prompts=["Hello", "What is 2+2?"], prompts_file=str(prompts_file), batch_size=3)
    result = run_job(cfg)
    lines = [json.loads(line) for line in Path(result["output"]).read_text().splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2, 3]
    assert lines[0]["prompt"] == "Hello" and lines[3]["messages"] == conv["messages"]
    # the job's completions are the client's, rendered through the chat template
    expected = tiny_llm.chat([[{"role": "user", "content": "Hello"}]], cfg.sampling)[0]
    assert lines[0]["token_ids"] == expected.token_ids and lines[0]["completion"] == expected.text
    assert all(len(r["logprobs"]) == r["num_tokens"] for r in lines)
    run = mlflow.tracking.MlflowClient(tracking.uri).get_run(result["run_id"])
    assert run.data.metrics["result/prompts"] == 4 and run.data.metrics["generate/tokens_per_s"] > 0
    assert run.data.params["llm.model"] == "tiny"
    artifacts = [a.path for a in mlflow.tracking.MlflowClient(tracking.uri).list_artifacts(result["run_id"])]
    assert "completions.jsonl" in artifacts and "config.yaml" in artifacts


@pytest.mark.slow
def test_raw_completion_mode_and_resume(tracking, tmp_path, tiny_llm):
    txt = tmp_path / "prompts.txt"
    txt.write_text("one\n\ntwo\nthree\n")
    cfg = _config(tracking, tmp_path, prompts_file=str(txt), chat=False, batch_size=2)
    first = run_job(cfg)
    lines = Path(first["output"]).read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[1])["token_ids"] == tiny_llm.generate(["two"], cfg.sampling)[0].token_ids
    # an interrupted run left one line: resume generates only the rest
    Path(first["output"]).write_text(lines[0] + "\n")
    cfg.resume = True
    second = run_job(cfg)
    assert second["generated_prompts"] == 2
    resumed = [json.loads(line) for line in Path(second["output"]).read_text().splitlines()]
    # batches differ from the first run (padding), so logprobs agree to float precision only
    for new, old in zip(resumed, map(json.loads, lines)):
        assert new["logprobs"] == pytest.approx(old.pop("logprobs"), abs=1e-4)
        assert {k: v for k, v in new.items() if k != "logprobs"} == old
    assert len(resumed) == 3


def test_bad_prompt_sources_are_config_errors(tracking, tmp_path):
    with pytest.raises(ConfigError, match="no prompts"):
        load_prompts(_config(tracking, tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        load_prompts(_config(tracking, tmp_path, prompts_file=str(tmp_path / "nope.txt")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        load_prompts(_config(tracking, tmp_path, prompts_file=str(bad)))
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: expected an object with 'prompt' or 'messages'"):
        load_prompts(_config(tracking, tmp_path, prompts_file=str(bad)))
