"""Every experiment config resolves against its job's schema (pipelines: every stage too).

This is `palaestra run CONFIG --dry-run` for the whole experiments/ tree, so a
renamed field or job breaks here, not an hour into a GPU run.
"""

from pathlib import Path

import pytest

from palaestra.shared.jobs import PipelineConfig, load_config, stage_configs

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").rglob("*.yaml"))


def test_there_are_experiments():
    names = {p.relative_to(p.parents[1]).as_posix() for p in EXPERIMENTS}
    assert "experiments/quickstart.yaml" in names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_experiment_resolves(path):
    cfg = load_config(path)
    assert cfg.job
    if isinstance(cfg, PipelineConfig):
        stages = stage_configs(cfg)
        assert stages, f"{path} has no stages"
        for stage in stages.values():
            assert stage.tracking.experiment == cfg.tracking.experiment


def test_quickstart_covers_every_line_of_work():
    cfg = load_config(Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml")
    jobs = {stage.job.split(".")[0] for stage in stage_configs(cfg).values()}
    assert {"llm", "datagen", "egpo", "mars", "aed"} <= jobs
