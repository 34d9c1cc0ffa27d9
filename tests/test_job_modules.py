"""One job per module named after it (issue 24): job ``rl.train`` is ``palaestra/shared/rl/train.py``, ``mars.eval``
is ``palaestra/mars/eval.py``, ``pipeline`` is ``palaestra/shared/pipeline.py``; so ``train.py`` and ``eval.py``
mean one thing everywhere (the job of that name), and ``jobs.py`` means the shared job registry alone."""

from pathlib import Path

from palaestra.shared.jobs import JOBS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["datagen", "egpo", "mars", "aed"]
SOURCES = {"shared": ROOT / "shared" / "src" / "palaestra" / "shared"} | {
    p: ROOT / "packages" / p / "src" / "palaestra" / p for p in PACKAGES
}


def _job_module(name: str) -> str:
    """``aed.attack`` -> ``palaestra.aed.attack``; a shared job (``rl.sft``) -> ``palaestra.shared.rl.sft``."""
    return f"palaestra.{name}" if name.split(".")[0] in PACKAGES else f"palaestra.shared.{name}"


def test_every_job_is_defined_in_the_module_named_after_it():
    names = [n for n in JOBS.names() if not n.startswith("test.")]  # tests register their own `test.*` jobs
    assert {"pipeline", "rl.train", "mars.eval", "aed.attack", "aed.victim"} <= set(names)
    misplaced = {n: JOBS.get(n).run.__module__ for n in names if JOBS.get(n).run.__module__ != _job_module(n)}
    assert not misplaced, f"jobs outside the module named after them: {misplaced}"


def test_train_and_eval_modules_are_jobs_and_jobs_py_is_the_registry():
    jobs = {_job_module(n) for n in JOBS.names() if not n.startswith("test.")}
    for src in SOURCES.values():
        for path in src.rglob("*.py"):
            module = "palaestra." + ".".join(path.relative_to(src.parent).with_suffix("").parts)
            if path.name in ("train.py", "eval.py"):
                assert module in jobs, f"{module} is named like a job's module but holds no job"
            if path.name == "jobs.py":
                assert module == "palaestra.shared.jobs", f"{module}: jobs.py is the shared job registry's name"
