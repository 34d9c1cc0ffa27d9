"""Jobs: what ``palaestra run CONFIG`` executes.

A job is a function ``run(cfg, tracker) -> dict`` with a config dataclass
(a `JobConfig` subclass), registered by name::

    @job("llm.generate", LLMGenerateConfig)
    def generate(cfg: LLMGenerateConfig, tracker: Tracker) -> dict: ...

Packages add jobs through the ``palaestra.jobs`` entry-point group: each entry
point names a module whose import registers its jobs, lazily (``"module:attr"``,
imported when the job is looked up). `job_summary` reads a job's summary from
its module's source, so ``palaestra jobs`` imports no job module (nor the torch
some of them import).

Each job lives in the module named after it (``rl.train`` in ``rl/train.py``,
``mars.eval`` in ``mars/eval.py``); the built-in ``pipeline`` job, stages run
as nested MLflow runs, is `palaestra.shared.pipeline`.

A job's summary (the dict it returns) may carry two keys for people rather
than for MLflow: ``headline``, one line with the job's headline figure and its
interval (`format_headline` writes one), and ``artifacts``, where its files
are. `run_job` adds ``artifacts`` (the run's MLflow artifact directory) when
the job gives none and tags the run with the headline; a run (a pipeline's too) ends
with `summary_table`: one line per stage (what ran, headline, artifacts) and the
command that opens the MLflow UI.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.shared import reproducibility
from palaestra.shared.config import ConfigError, JobConfig, read_yaml, resolve
from palaestra.shared.registry import Registry
from palaestra.shared.tracking import Tracker


@dataclass(frozen=True)
class Job:
    name: str
    config: type[JobConfig]
    run: Callable[[Any, Tracker], dict | None]
    metric: str | None = None
    """The key of the job's summary that a matrix's table shows by default (palaestra.shared.matrix)."""

    @property
    def summary(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0] if self.run.__doc__ else ""


JOBS: Registry[Job] = Registry("job", "palaestra.jobs")


def job(name: str, config: type[JobConfig], metric: str | None = None) -> Callable:
    """Register the decorated function as job `name` with config schema `config` (and its headline `metric`)."""

    def decorator(fn: Callable) -> Callable:
        JOBS.register(name, Job(name, config, fn, metric))
        return fn

    return decorator


def job_summary(name: str) -> str:
    """The first line of job `name`'s docstring, read from its module's source while the job is not imported."""
    entry = JOBS.peek(name)
    if isinstance(entry, str):
        doc = _source_docstring(entry)
        if doc is not None:
            return doc.strip().splitlines()[0] if doc.strip() else ""
    return JOBS.get(name).summary


def _source_docstring(path: str) -> str | None:
    """The docstring of the top-level function ``attr`` of ``"module:attr"``, without importing the module (None
    when the source or the function is not there: the caller imports it instead)."""
    module, _, attr = path.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attr:
            return ast.get_docstring(node) or ""
    return None


def load_config(source: str | Path | dict[str, Any], overrides: Sequence[str] = ()) -> JobConfig:
    """Resolve a config file (or mapping) plus ``key=value`` overrides into its job's dataclass."""
    data = read_yaml(source) if isinstance(source, str | Path) else dict(source)
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("job=")), data.get("job"))
    if not name:
        where = source if isinstance(source, str | Path) else "config"
        raise ConfigError(f"{where}: missing required key 'job' (see `palaestra jobs`)")
    spec = JOBS.get(str(name))
    if name == "pipeline" and isinstance(source, str | Path):
        data.setdefault("config_dir", str(Path(source).parent))  # stage paths are relative to the file
    return resolve(spec.config, data, overrides)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        pass


def run_job(cfg: JobConfig, run_name: str | None = None, parent_run_id: str | None = None) -> dict:
    """Seed, open an MLflow run (nested if one is open, or under `parent_run_id`), run the job, return its summary."""
    spec = JOBS.get(cfg.job)
    seed_everything(cfg.seed)
    reproducibility.apply_torch(cfg.torch_threads)  # threads (fixed under the switch), deterministic kernels
    with Tracker.start(cfg, name=run_name, parent_run_id=parent_run_id) as tracker:
        result = spec.run(cfg, tracker) or {}
        numeric = {
            f"result/{k}": v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        tracker.log_metrics(numeric)
        if result.get("headline"):
            tracker.set_tags({"palaestra.headline": result["headline"]})
        tracker.set_tags({"palaestra.status": "finished"})
        artifacts = result.get("artifacts") or tracker.artifact_dir()
        return {"run_id": tracker.run_id, **result, **({"artifacts": str(artifacts)} if artifacts else {})}


def format_headline(label: str, value: float, interval: tuple[float, float] | None = None, note: str = "") -> str:
    """``label value [lo, hi] (note)``: a job's headline figure for the end-of-run table.

    >>> format_headline("win rate vs random", 0.44, (0.41, 0.47), "95% Wilson, 500 episodes")
    'win rate vs random 0.44 [0.41, 0.47] (95% Wilson, 500 episodes)'
    """
    text = f"{label} {_num(value)}"
    if interval is not None:
        text += f" [{_num(interval[0])}, {_num(interval[1])}]"
    return f"{text} ({note})" if note else text


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.2f}"


def summary_table(rows: list[dict[str, Any]], tracking_uri: str | None = None) -> str:
    """The stages of a pipeline, one line each (stage, job, headline, artifacts), then each stage's ``reading`` (what
    its headline shows and what it does not) where it has one, then how to open MLflow."""
    header = {"stage": "stage", "job": "job", "headline": "headline", "artifacts": "artifacts"}
    table = [header, *({k: str(r.get(k) or "-") for k in header} for r in rows)]
    widths = {k: max(len(r[k]) for r in table) for k in header}
    lines = ["  ".join(r[k].ljust(widths[k]) for k in header).rstrip() for r in table]
    readings = [f"  {r['stage']}: {r['reading']}" for r in rows if r.get("reading")]
    if readings:
        lines += ["what each headline shows, and what it does not:", *readings]
    if tracking_uri:
        lines.append(f"MLflow UI: {mlflow_ui_command(tracking_uri)}  (then http://127.0.0.1:5000)")
    return "\n".join(lines)


def mlflow_ui_command(tracking_uri: str) -> str:
    """The shell command that opens the MLflow UI on `tracking_uri` (the venv's ``mlflow`` when there is one), with
    one worker process: MLflow's default four did not come up on a loaded 2-core machine, one did."""
    import sys

    exe = Path(sys.executable).parent / "mlflow"
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(Path.cwd())
    program = str(exe) if exe.exists() else "mlflow"
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} (a running MLflow server)"
    return f"{program} ui --workers 1 --backend-store-uri {tracking_uri}"  # MLflow's default 4 stall a busy machine
