"""The fast CLI: ``palaestra jobs``, ``show``, ``--dry-run`` and ``plan`` import neither torch nor transformers
(the RL jobs too: their configs and checks are torch-free, their trainer is imported when the job runs), and
``jobs`` takes under a second of CPU (``python -X importtime`` in a child process, its CPU from
``resource.getrusage``)."""

import importlib.util
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")
PACKAGES = ("datagen", "egpo", "mars", "aed")


def installed(package: str) -> bool:
    """Whether a Palaestra package is importable (shared's tests also run with the core alone)."""
    return importlib.util.find_spec(f"palaestra.{package}") is not None


def imported_modules(importtime_log: str) -> set[str]:
    """The modules a ``-X importtime`` log names (its last column, indentation stripped)."""
    lines = [line for line in importtime_log.splitlines() if line.startswith("import time:") and "|" in line]
    return {line.rsplit("|", 1)[1].strip() for line in lines}


def packages_of(args: tuple[str, ...]) -> list[str]:
    """The Palaestra packages whose jobs a command shows or runs (the quickstart's stages: all four)."""
    if args[1] == "experiments/quickstart.yaml":
        return list(PACKAGES)
    first = args[1].split(".")[0] if args[0] == "show" else args[1].split("/")[1]
    return [first] if first in PACKAGES else []


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess, float, set[str]]:
    """Run ``palaestra ARGS`` with ``-X importtime``: the result, the child's CPU seconds, the modules it imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "palaestra.shared.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return out, cpu, imported_modules(out.stderr)


def test_the_detector_sees_torch():
    """Negative control: a child that imports torch (the policies' models) shows it in its importtime log."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import palaestra.shared.rl.policies"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"torch", "transformers"} <= imported_modules(out.stderr)


def test_jobs_imports_no_ml_stack_and_takes_under_a_second_of_cpu():
    out, cpu, modules = run_cli("jobs")
    assert out.returncode == 0, out.stderr[-2000:]
    assert not modules & set(HEAVY), f"`palaestra jobs` imported {sorted(modules & set(HEAVY))}"
    assert not any(m.endswith((".train", ".trainer")) for m in modules), "a job module was imported to list it"
    listed = dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())
    # the summaries read from source are the docstrings' first lines (independent reference: the imported job)
    from palaestra.shared.jobs import JOBS

    for name in ("pipeline", "llm.generate", "datagen.generate", "egpo.eval", "aed.attack"):
        if name.split(".")[0] in ("pipeline", "llm") or installed(name.split(".")[0]):
            assert listed[name].strip() == JOBS.get(name).summary
    assert cpu < 1.0, f"`palaestra jobs` took {cpu:.2f} s of CPU"


@pytest.mark.parametrize(
    "args",
    [
        ("show", "datagen.generate"),
        ("show", "egpo.eval"),
        ("show", "mars.eval"),
        ("show", "aed.attack"),
        ("run", "experiments/datagen/quickstart.yaml", "--dry-run"),
        ("run", "experiments/egpo/reproduce.yaml", "--dry-run", "only=[datagen]"),
        # the RL jobs: their configs, value checks and memory plan need no torch (rl/policy_configs.py)
        ("show", "rl.train"),
        ("show", "rl.sft"),
        ("show", "mars.train"),
        ("show", "egpo.train"),
        ("show", "datagen.mine"),
        ("run", "experiments/shared/toy_rl.yaml", "--dry-run"),
        ("run", "experiments/quickstart.yaml", "--dry-run"),
        ("plan", "experiments/shared/toy_rl.yaml"),
    ],
)
def test_light_jobs_show_and_dry_run_import_no_ml_stack(args):
    for package in packages_of(args):
        if not installed(package):
            pytest.skip(f"palaestra-{package} is not installed")
    out, _, modules = run_cli(*args)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not modules & set(HEAVY), f"`palaestra {' '.join(args)}` imported {sorted(modules & set(HEAVY))}"
