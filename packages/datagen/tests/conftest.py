"""Fixtures of the datagen tests: one deterministic generation run shared by the independent checks."""

from __future__ import annotations

import pytest

from palaestra.shared.config import TrackingConfig


@pytest.fixture(scope="session")
def deterministic_run(tmp_path_factory):
    """120 items of the deterministic pipeline, in process (Ray is exercised by the job tests)."""
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.shared.tracking import Tracker

    out = tmp_path_factory.mktemp("datagen")
    cfg = DataGenerationConfig(
        num_samples=120, workers=0, output_dir=str(out), seed=7, tracking=TrackingConfig(enabled=False)
    )
    result = generate(cfg, Tracker(cfg.tracking))
    return cfg.output_path, result
