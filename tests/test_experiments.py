"""Every experiment config resolves against its job's schema (pipelines: every stage too; a matrix: every
combination of its seeds and arms).

This is `palaestra run CONFIG --dry-run` for the whole experiments/ tree, so a
renamed field or job breaks here, not an hour into a GPU run.
"""

from pathlib import Path

import pytest

from palaestra.shared.cli import main
from palaestra.shared.config import read_yaml
from palaestra.shared.jobs import JobConfig, load_config
from palaestra.shared.matrix import combinations, split_matrix
from palaestra.shared.pipeline import PipelineConfig, stage_configs

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "experiments").rglob("*.yaml"))


def resolved(path: Path) -> list[JobConfig]:
    """The config of every run `palaestra run path` would start: one, or one per matrix combination."""
    data, matrix = split_matrix(read_yaml(path))
    if matrix is None:
        return [load_config(path)]
    return [c.cfg for c in combinations(data, matrix, config_dir=str(path.parent))[1]]


def test_there_are_experiments():
    names = {p.relative_to(p.parents[1]).as_posix() for p in EXPERIMENTS}
    assert "experiments/quickstart.yaml" in names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_experiment_resolves_with_dry_run(path, capsys):
    """`palaestra run PATH --dry-run` exits 0 and prints every run's resolved config."""
    code = main(["run", str(path), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("\njob: ") + out.startswith("job: ") >= 1
    for cfg in resolved(path):
        assert cfg.job
        if isinstance(cfg, PipelineConfig):
            stages = stage_configs(cfg)
            assert stages, f"{path} has no stages"
            for stage in stages.values():
                assert stage.tracking.experiment == cfg.tracking.experiment


def test_experiment_headers_are_short():
    """A config's header says what it is, the command and the record to read; its history lives in docs/."""
    for path in EXPERIMENTS:
        lines = path.read_text().splitlines()
        header = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        assert header <= 25, f"{path.relative_to(ROOT)}: a {header}-line header (history goes to docs/experiments/)"
        assert not any("Revision" in line for line in lines[:header]), f"{path.relative_to(ROOT)}: revision history"


def test_no_analysis_scripts_in_experiments():
    """experiments/ holds configs; analysis scripts live in a package's scripts/ or tools/."""
    assert not [p.relative_to(ROOT).as_posix() for p in (ROOT / "experiments").rglob("*.py")]


def test_quickstart_covers_every_line_of_work():
    cfg = load_config(ROOT / "experiments" / "quickstart.yaml")
    jobs = {stage.job.split(".")[0] for stage in stage_configs(cfg).values()}
    assert {"llm", "datagen", "egpo", "mars", "aed"} <= jobs
