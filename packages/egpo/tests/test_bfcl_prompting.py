"""BFCL's prompting mode (``prompt: bfcl_prompting``): the handler's own system prompt, its parser, and the config
that scores a model as the papers' figures were scored (resolved, and rehearsed on the embedded ``tiny`` model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import mlflow
import pytest

from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job

pytestmark = pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")

CONFIG = Path(__file__).resolve().parents[3] / "experiments" / "egpo" / "bfcl_prompting.yaml"
PROMPTING = "Qwen/Qwen3-4B-Instruct-2507"


def test_prompting_mode_sends_bfcls_system_prompt_and_no_tools():
    from bfcl_eval.model_handler.utils import system_prompt_pre_processing_chat_model

    from palaestra.egpo.eval import build_envs

    (env,), _ = build_envs("simple_python", 1, decoder="bfcl", prompt="bfcl_prompting", bfcl_model=PROMPTING)
    env.reset(0)
    messages = env.observe("agent")
    # BFCL's own pre-processing of the same entry (independent of the handler object we hold)
    expected = system_prompt_pre_processing_chat_model(list(env.task.messages), env.task.tools, env.task.id)
    assert messages == expected and messages[0]["role"] == "system"
    assert env.task.tools[0]["name"] in messages[0]["content"]  # the function docs are in the system prompt
    assert env.tools("agent") is None
    # the prompting handler parses Python call lists; the FC handler's <tool_call> JSON is not a call there
    call = f"[{env.task.tools[0]['name']}(x=1)]"
    from palaestra.egpo.eval import score_single_turn

    decoded = score_single_turn(env.task, call, "bfcl", PROMPTING)["decoded"]
    assert decoded == [{env.task.tools[0]["name"]: {"x": 1}}]
    json_call = f'<tool_call>\n{{"name": "{env.task.tools[0]["name"]}", "arguments": {{"x": 1}}}}\n</tool_call>'
    assert score_single_turn(env.task, json_call, "bfcl", PROMPTING)["decoded"] is None


def test_config_resolves_and_refuses_a_mode_mismatch(tmp_path):
    from palaestra.egpo.eval import check_bfcl_settings

    cfg = load_config(CONFIG, [f"output_dir={tmp_path}"])
    assert (cfg.prompt, cfg.decoder, cfg.bfcl_model) == ("bfcl_prompting", "bfcl", PROMPTING)
    assert (cfg.max_tokens_per_turn, cfg.max_context_tokens, cfg.temperature) == (4096, None, 0.001)
    check_bfcl_settings(cfg)
    with pytest.raises(ConfigError, match="prompting-mode bfcl_model"):
        check_bfcl_settings(load_config(CONFIG, ["bfcl_model=Qwen/Qwen3-4B-Instruct-2507-FC"]))
    with pytest.raises(ConfigError, match="not a model of the installed bfcl-eval"):
        check_bfcl_settings(load_config(CONFIG, ["bfcl_model=Qwen/Qwen3-4B-Instruct-2507-XX"]))


@pytest.mark.slow
def test_prompting_config_rehearsed_on_tiny(tmp_path, tracking):
    cfg = load_config(
        CONFIG,
        [
            f"output_dir={tmp_path}",
            "llm.model=tiny",
            "llm.device=cpu",
            "categories=[simple_python,irrelevance,multi_turn_base]",
            "limit=1",
            "max_tokens_per_turn=8",
            "max_model_calls=2",
        ],
    )
    cfg.tracking = tracking
    out = run_job(cfg)
    run = mlflow.MlflowClient(tracking.uri).get_run(out["run_id"])
    assert run.data.tags["bfcl.prompt"] == "bfcl_prompting" and run.data.tags["bfcl.model"] == PROMPTING
    assert 0.0 <= run.data.metrics["bfcl/simple_python/accuracy"] <= 1.0
    folder = PROMPTING.replace("/", "_")
    assert list((tmp_path / "bfcl" / "result" / folder).rglob("BFCL_v4_simple_python_result.json"))
