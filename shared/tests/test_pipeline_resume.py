"""A pipeline resumes from its finished stages: a second run of the same resolved config skips a stage that ran to
its end (its ``pipeline/<stage>.json``), runs a stage whose config changed or that failed, and ``resume: false``
runs them all; each stage's ``reading`` is printed under the end-of-run table."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from palaestra.shared import cli
from palaestra.shared.config import JobConfig
from palaestra.shared.jobs import job


@dataclass
class CountConfig(JobConfig):
    log: str = ""
    """A file that gets one line per run of the stage."""
    fail_flag: str = ""
    """While this file exists the job fails (and removes it): a stage that dies once."""


@job("test.resume_count", CountConfig)
def count(cfg, tracker):
    """Appends one line to `log` per run; fails once while `fail_flag` exists."""
    flag = Path(cfg.fail_flag) if cfg.fail_flag else None
    if flag is not None and flag.exists():
        flag.unlink()
        raise RuntimeError("the stage died")
    with open(cfg.log, "a") as f:
        f.write(f"{cfg.seed}\n")
    return {"runs": len(Path(cfg.log).read_text().splitlines()), "headline": f"run {cfg.seed}"}


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def pipeline_file(tmp_path, tracking):
    def write(extra: str = "") -> Path:
        path = tmp_path / "p.yaml"
        path.write_text(
            f"job: pipeline\noutput_dir: {tmp_path / 'out'}\n"
            f"tracking: {{experiment: t, uri: '{tracking.uri}', artifact_root: '{tracking.artifact_root}'}}\n"
            "stages:\n"
            f"  first: {{job: test.resume_count, log: {tmp_path / 'first.log'}, reading: 'counts its runs'}}\n"
            f"  second: {{job: test.resume_count, log: {tmp_path / 'second.log'}, fail_flag: {tmp_path / 'fail'}}}\n"
            + extra
        )
        return path

    return write


def test_a_second_run_skips_the_finished_stages(tmp_path, pipeline_file, capsys):
    path = pipeline_file()
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    assert cli.main(["run", str(path)]) == 0
    assert (runs(first), runs(second)) == (1, 1)
    out = capsys.readouterr().out
    assert "what each headline shows, and what it does not:\n  first: counts its runs" in out
    assert cli.main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert (runs(first), runs(second)) == (1, 1), "a finished stage ran again"
    assert out.count("finished before") == 2 and "run 0" in out  # the recorded headline is shown again
    # a changed stage config runs that stage again, and only it
    assert cli.main(["run", str(path), "stages.second.seed=5"]) == 0
    assert (runs(first), runs(second)) == (1, 2)
    # control: resume=false runs every stage
    assert cli.main(["run", str(path), "resume=false"]) == 0
    assert (runs(first), runs(second)) == (2, 3)


def test_a_run_that_died_resumes_at_the_stage_that_failed(tmp_path, pipeline_file):
    path = pipeline_file()
    (tmp_path / "fail").touch()
    with pytest.raises(RuntimeError, match="the stage died"):
        cli.main(["run", str(path)])
    assert (runs(tmp_path / "first.log"), runs(tmp_path / "second.log")) == (1, 0)
    assert not (tmp_path / "out" / "pipeline" / "second.json").exists()
    assert cli.main(["run", str(path)]) == 0
    assert (runs(tmp_path / "first.log"), runs(tmp_path / "second.log")) == (1, 1)
