"""The built-in ``pipeline`` job: several job configs run in order, each as a nested MLflow run under this one
(the quickstart is one).

A stage without an ``output_dir`` of its own writes to the pipeline's; stages refer to the pipeline's output
directory, and so to each other's files, through ``${output_dir}`` (OmegaConf interpolation: the ``stages``
mapping resolves against the pipeline config, overrides included), so ``output_dir=DIR`` moves every stage's
files together: ``output_dir=${output_dir}/egpo`` for a stage's own directory,
``path: ${output_dir}/datagen/x/samples.jsonl`` for a file an earlier stage wrote. `stage_configs` resolves
every stage before the first one runs (``--dry-run``, ``palaestra plan`` and the matrix use it too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig, read_yaml, value_check
from palaestra.shared.jobs import job, load_config, run_job
from palaestra.shared.registry import UnknownNameError
from palaestra.shared.tracking import Tracker


@dataclass
class PipelineConfig(JobConfig):
    """Run several job configs in order, each as a nested MLflow run under this one."""

    stages: dict[str, Any] = field(default_factory=dict)
    """Stage name -> a job config (inline mapping with a ``job`` key, or ``{config: path, overrides: [...]}``);
    ``${output_dir}`` in a stage is the pipeline's output directory."""
    only: list[str] = field(default_factory=list, metadata=value_check("palaestra.shared.pipeline:check_only"))
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
    return asdict(obj)
