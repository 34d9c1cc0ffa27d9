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
