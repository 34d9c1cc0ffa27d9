"""The built-in ``pipeline`` job: several job configs run in order, each as a nested MLflow run under this one
(the quickstart is one).

A stage without an ``output_dir`` of its own writes to the pipeline's; stages refer to the pipeline's output
directory, and so to each other's files, through ``${output_dir}`` (OmegaConf interpolation: the ``stages``
mapping resolves against the pipeline config, overrides included), so ``output_dir=DIR`` moves every stage's
files together: ``output_dir=${output_dir}/egpo`` for a stage's own directory,
``path: ${output_dir}/datagen/x/samples.jsonl`` for a file an earlier stage wrote. `stage_configs` resolves
every stage before the first one runs (``--dry-run``, ``palaestra plan`` and the matrix use it too).

A pipeline resumes: a stage that ran to its end leaves ``<output_dir>/pipeline/<stage>.json`` (its summary and
the hash of its resolved config, `matrix.config_hash`), and a later run of the pipeline skips that stage while its
resolved config is the same, reusing the summary (``resume: false`` runs every stage again).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig, read_yaml, value_check
from palaestra.shared.jobs import job, load_config, run_job
from palaestra.shared.matrix import config_hash
from palaestra.shared.registry import UnknownNameError
from palaestra.shared.tracking import Tracker


@dataclass
class PipelineConfig(JobConfig):
    """Run several job configs in order, each as a nested MLflow run under this one."""

    stages: dict[str, Any] = field(default_factory=dict)
    """Stage name -> a job config (inline mapping with a ``job`` key, or ``{config: path, overrides: [...]}``);
    ``${output_dir}`` in a stage is the pipeline's output directory. A stage's ``reading:`` (not passed to its job)
    says what its headline shows and what it does not; the end-of-run table prints it under the stages."""
    only: list[str] = field(default_factory=list, metadata=value_check("palaestra.shared.pipeline:check_only"))
    """Run only these stages (empty: all)."""
    config_dir: str = "."
    """Directory that stage ``config:`` paths are relative to (set to the pipeline file's own directory)."""
    resume: bool = True
    """Skip a stage that finished before with the same resolved config (its ``<output_dir>/pipeline/<stage>.json``)."""


@job("pipeline", PipelineConfig)
def pipeline(cfg: PipelineConfig, tracker: Tracker) -> dict:
    """Run a sequence of job configs as nested runs (e.g. the quickstart)."""
    stages = stage_configs(cfg)  # every stage resolves before the first one runs
    results: dict[str, Any] = {}
    rows = []
    for name, stage_cfg in stages.items():
        record = Path(cfg.output_dir) / "pipeline" / f"{name}.json"
        out = finished_stage(record, stage_cfg) if cfg.resume else None
        if out is not None:
            print(f"== stage {name}: {stage_cfg.job} finished before ({record}), not run again", flush=True)
        else:
            print(f"== stage {name}: {stage_cfg.job}", flush=True)
            out = run_job(stage_cfg, run_name=name)
            _record_stage(record, stage_cfg, out)
        results.update({f"{name}/{k}": v for k, v in out.items() if k not in ("run_id", "headline", "artifacts")})
        row = {"stage": name, "job": stage_cfg.job, "headline": out.get("headline"), "artifacts": out.get("artifacts")}
        if cfg.stages[name].get("reading"):
            row["reading"] = " ".join(str(cfg.stages[name]["reading"]).split())
        rows.append(row)
    tracker.log_dict(rows, "stages.json")
    return {**results, "stages": rows}


def finished_stage(record: Path, stage_cfg: JobConfig) -> dict[str, Any] | None:
    """The summary a stage recorded at `record` when it finished with the same resolved config, else None."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return data.get("summary") if data.get("config_hash") == config_hash(stage_cfg) else None


def _record_stage(record: Path, stage_cfg: JobConfig, summary: dict[str, Any]) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(".json.tmp")  # written whole, then renamed: a killed run leaves no half record
    tmp.write_text(json.dumps({"config_hash": config_hash(stage_cfg), "summary": summary}, indent=2, default=str))
    tmp.replace(record)


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
    stage.pop("reading", None)  # for the reader of the summary, not the job
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
