"""Jobs: what ``palaestra run CONFIG`` executes.

A job is a function ``run(cfg, tracker) -> dict`` with a config dataclass
(a `JobConfig` subclass), registered by name::

    @job("llm.generate", LLMGenerateConfig)
    def generate(cfg: LLMGenerateConfig, tracker: Tracker) -> dict: ...

Packages add jobs through the ``palaestra.jobs`` entry-point group: each entry
point names a module whose import registers its jobs. Job functions import
their heavy dependencies inside, so listing jobs stays instant.

The built-in ``pipeline`` job runs a list of stages, each a job config of its
own, as nested MLflow runs (the quickstart is one). A stage without an
``output_dir`` of its own writes to the pipeline's; stages refer to the
pipeline's output directory, and so to each other's files, through
``${output_dir}`` (OmegaConf interpolation: the ``stages`` mapping resolves
against the pipeline config, overrides included), so ``output_dir=DIR`` moves
every stage's files together: ``output_dir=${output_dir}/egpo`` for a stage's
own directory, ``path: ${output_dir}/datagen/x/samples.jsonl`` for a file an
earlier stage wrote.

A job's summary (the dict it returns) may carry two keys for people rather
than for MLflow: ``headline``, one line with the job's headline figure and its
interval (`format_headline` writes one), and ``artifacts``, where its files
are. `run_job` adds ``artifacts`` (the run's MLflow artifact directory) when
the job gives none and tags the run with the headline; a pipeline ends with
`summary_table`: one line per stage (what ran, headline, artifacts) and the
command that opens the MLflow UI.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig, read_yaml, resolve, value_check
from palaestra.shared.registry import Registry, UnknownNameError
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
    if cfg.torch_threads > 0:
        import torch

        torch.set_num_threads(cfg.torch_threads)
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
    """The stages of a pipeline, one line each (stage, job, headline, artifacts), then how to open MLflow."""
    header = {"stage": "stage", "job": "job", "headline": "headline", "artifacts": "artifacts"}
    table = [header, *({k: str(r.get(k) or "-") for k in header} for r in rows)]
    widths = {k: max(len(r[k]) for r in table) for k in header}
    lines = ["  ".join(r[k].ljust(widths[k]) for k in header).rstrip() for r in table]
    if tracking_uri:
        lines.append(f"MLflow UI: {mlflow_ui_command(tracking_uri)}  (then http://127.0.0.1:5000)")
    return "\n".join(lines)


def mlflow_ui_command(tracking_uri: str) -> str:
    """The shell command that opens the MLflow UI on `tracking_uri` (the venv's ``mlflow`` when there is one)."""
    import sys

    exe = Path(sys.executable).parent / "mlflow"
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(Path.cwd())
    program = str(exe) if exe.exists() else "mlflow"
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} (a running MLflow server)"
    return f"{program} ui --backend-store-uri {tracking_uri}"


@dataclass
class PipelineConfig(JobConfig):
    """Run several job configs in order, each as a nested MLflow run under this one."""

    stages: dict[str, Any] = field(default_factory=dict)
    """Stage name -> a job config (inline mapping with a ``job`` key, or ``{config: path, overrides: [...]}``);
    ``${output_dir}`` in a stage is the pipeline's output directory."""
    only: list[str] = field(default_factory=list, metadata=value_check("palaestra.shared.jobs:check_only"))
    """Run only these stages (empty: all)."""
    config_dir: str = "."
    """Directory that stage ``config:`` paths are relative to (set to the pipeline file's own directory)."""


@job("pipeline", PipelineConfig)
def pipeline(cfg: PipelineConfig, tracker: Tracker) -> dict:
    """Run a sequence of job configs as nested runs (e.g. the quickstart)."""
    stages = stage_configs(cfg)  # every stage resolves before the first one runs
    results: dict[str, Any] = {}
    rows = []
    for name, stage_cfg in stages.items():
        print(f"== stage {name}: {stage_cfg.job}", flush=True)
        out = run_job(stage_cfg, run_name=name)
        results.update({f"{name}/{k}": v for k, v in out.items() if k not in ("run_id", "headline", "artifacts")})
        row = {"stage": name, "job": stage_cfg.job, "headline": out.get("headline"), "artifacts": out.get("artifacts")}
        rows.append(row)
    tracker.log_dict(rows, "stages.json")
    return {**results, "stages": rows}


def check_only(only: list[str], owner: PipelineConfig) -> str | None:
    """Every name in ``only`` is a stage of the pipeline."""
    unknown = [name for name in only if name not in owner.stages]
    return f"unknown stage(s) {unknown}; stages: {list(owner.stages)}" if unknown else None


def stage_configs(cfg: PipelineConfig) -> dict[str, JobConfig]:
    """The resolved config of each stage to run, in order."""
    return {
        name: _stage_config(cfg, name, stage) for name, stage in cfg.stages.items() if not cfg.only or name in cfg.only
    }


def _stage_config(cfg: PipelineConfig, name: str, stage: dict[str, Any]) -> JobConfig:
    stage = dict(stage)
    overrides = list(stage.pop("overrides", []))
    source: Any = stage
    if "config" in stage:
        source = read_yaml(Path(cfg.config_dir) / stage.pop("config"))
        source.pop("matrix", None)  # a stage is one run: the file's settings, not its seeds and arms
        source = {**source, **stage}
    # stages inherit the pipeline's seed, output_dir, cluster and (when set) torch_threads unless they set their
    # own; tracking is always the pipeline's, so that every stage is a nested run in its experiment
    inherited = {"seed": cfg.seed, "output_dir": cfg.output_dir, "cluster": _plain(cfg.cluster)}
    if cfg.torch_threads > 0:  # an unset pipeline value must not override a job's own default
        inherited["torch_threads"] = cfg.torch_threads
    for key, value in inherited.items():
        source.setdefault(key, value)
    source["tracking"] = {**_plain(cfg.tracking), "run_name": name}
    try:
        return load_config(source, overrides)
    except (ConfigError, UnknownNameError) as err:
        raise ConfigError(f"stage '{name}': {err}") from None


def _plain(obj: Any) -> dict:
    from dataclasses import asdict

    return asdict(obj)
