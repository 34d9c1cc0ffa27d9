"""Every experiments/datagen config resolves (dry run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.shared.jobs import load_config

CONFIGS = sorted((Path(__file__).parents[3] / "experiments" / "datagen").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_resolves(path):
    cfg = load_config(path)
    assert cfg.job in ("datagen.generate", "datagen.mine", "datagen.export")


def test_quickstart_output_path_is_predictable():
    cfg = load_config(Path(__file__).parents[3] / "experiments" / "datagen" / "quickstart.yaml")
    assert str(cfg.output_path) == "outputs/datagen/quickstart/samples.jsonl"


def test_llm_configs_have_the_judge_filter_on():
    """A config with an LLM role filters its samples through the LLM judge (HardGen, FunReason-MT)."""
    llm_configs = 0
    for path in CONFIGS:
        cfg = load_config(path)
        roles = getattr(cfg, "roles", None)
        if roles is None or not any(getattr(roles, r) == "llm" for r in ("tool_maker", "query_writer", "reasoner")):
            continue
        llm_configs += 1
        assert roles.judge == "llm", path.name
    assert llm_configs >= 4
