"""The `palaestra` command: jobs, run --dry-run, and one-line errors for user mistakes."""

import subprocess
import sys

import pytest


def palaestra(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "palaestra.shared.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_jobs_lists_generate():
    out = palaestra("jobs")
    assert out.returncode == 0, out.stderr
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert "llm.generate" in names and "pipeline" in names


def test_dry_run_prints_resolved_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("job: llm.generate\n")
    out = palaestra("run", str(cfg), "seed=3", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "job: llm.generate" in out.stdout and "seed: 3" in out.stdout


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (None, [], "config file not found"),
        ("job: [oops\n", [], "malformed YAML"),
        ("job: llm.generat\n", [], "did you mean 'llm.generate'"),
        ("job: llm.generate\n", ["sede=1"], "unknown key 'sede'; did you mean 'seed'"),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, text, args, message):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    out = palaestra("run", str(path), *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
