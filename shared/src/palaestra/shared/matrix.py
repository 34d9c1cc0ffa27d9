"""Seeds x arms as data: run every combination of a config's matrix, in parallel on Ray, resumable, one table.

A config holds one protocol; its seeds and arms are a ``matrix:`` section (or
``--matrix`` on the command line, which replaces the section's axes of the
same name)::

    job: rl.train
    ...
    matrix:
      axes: {seed: [0, 1, 2], advantages: [grpo, egpo]}
      arms:                      # named config fragments, per axis
        advantages:
          grpo: {advantages: [{name: grpo}]}
          egpo: {advantages: [{name: grpo}, {name: entropy_clipped}]}
      metric: eval_after_reward_mean

    palaestra run X.yaml --matrix seed=0,1,2 advantages=grpo,egpo

Each value of an axis either names a fragment in ``arms[axis]`` (a mapping
deep-merged into the config, as ``base:`` files are; lists are replaced whole)
or is an override ``axis=value``. A pipeline's control run is an arm: a
fragment that sets ``only:`` or a stage's ``overrides``.

Every combination resolves before the first one runs (a bad arm fails at
once, ``--dry-run`` included), then runs as a Ray task (its CPUs and GPUs from
``num_cpus``/``num_gpus``: the job's own process; the Ray workers a job starts
itself ask for their own), each as an MLflow run nested under one ``matrix``
run, with ``output_dir`` ``<output_dir>/<axis>-<value>_...``. A finished
combination leaves ``matrix_result.json`` there (its summary and a hash of its
resolved config); a later invocation reuses it instead of running it again,
unless the config changed. The end is one table: per arm (the combination of
the axes other than the seed axis) the metric's mean across seeds with its 95%
Student t interval, and the value of each seed.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig, deep_merge, resolve, to_yaml
from palaestra.shared.stats import t_mean_interval

RESULT_FILE = "matrix_result.json"


@dataclass
class MatrixConfig:
    """The ``matrix:`` section of a config."""

    axes: dict[str, list[Any]] = field(default_factory=dict)
    """Axis -> its values; a value names a fragment in ``arms[axis]`` or is set as ``axis=value``."""
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Axis -> value name -> a config fragment (a mapping merged into the config)."""
    metric: str | None = None
    """The summary key whose mean across seeds the table shows (a pipeline's: ``stage/key``), or else the name
    of a metric of the combination's MLflow run (its last value); default: the job's registered metric."""
    seed_axis: str = "seed"
    """The axis the interval is taken over; every other axis makes arms."""
    parallel: bool = True
    """Run combinations as Ray tasks at once where the cluster has room (False: one after another here)."""
    num_cpus: float = 1
    """CPUs each combination's own process asks Ray for."""
    num_gpus: float = 0
    """GPUs each combination's own process asks Ray for."""


@dataclass
class Combination:
    values: dict[str, Any]
    """Axis -> value."""
    cfg: JobConfig

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())

    @property
    def dirname(self) -> str:
        return "_".join(f"{_safe(k)}-{_safe(v)}" for k, v in self.values.items())

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)


def _safe(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(value)).strip("_") or "_"


def parse_axes(words: Sequence[str]) -> dict[str, list[Any]]:
    """``["seed=0,1,2", "advantages=grpo,egpo"]`` -> ``{"seed": [0, 1, 2], "advantages": ["grpo", "egpo"]}``."""
    import yaml

    axes: dict[str, list[Any]] = {}
    for word in words:
        key, sep, values = word.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"--matrix {word!r} is not of the form axis=value1,value2,...")
        axes[key] = [yaml.safe_load(v) if v else v for v in values.split(",")]
    return axes


def split_matrix(data: dict[str, Any], cli_axes: Sequence[str] = ()) -> tuple[dict[str, Any], MatrixConfig | None]:
    """The config mapping without its ``matrix:`` section, and that section (with ``--matrix`` axes) or None."""
    data = dict(data)
    section = data.pop("matrix", None)
    if section is None and not cli_axes:
        return data, None
    if section is not None and not isinstance(section, dict):
        raise ConfigError(f"'matrix' must be a mapping (axes, arms, metric, ...), got {type(section).__name__}")
    try:
        matrix = resolve(MatrixConfig, section or {})
    except ConfigError as err:
        raise ConfigError(f"matrix: {err}") from None
    matrix.axes = {**matrix.axes, **parse_axes(cli_axes)}
    if not matrix.axes:
        raise ConfigError("matrix: no axes (set matrix.axes or --matrix axis=v1,v2)")
    for axis, values in matrix.axes.items():
        if not values:
            raise ConfigError(f"matrix: axis '{axis}' has no values")
    for axis, named in matrix.arms.items():
        if axis not in matrix.axes:
            raise ConfigError(f"matrix.arms.{axis}: no such axis (axes: {', '.join(matrix.axes)})")
        for name, fragment in named.items():
            if not isinstance(fragment, dict):
                raise ConfigError(f"matrix.arms.{axis}.{name} must be a mapping of config keys")
    return data, matrix


def combinations(
    data: dict[str, Any], matrix: MatrixConfig, overrides: Sequence[str] = (), config_dir: str | None = None
) -> tuple[JobConfig, list[Combination]]:
    """The config without the matrix, and every combination of the axes, resolved (so a bad one fails before
    any runs), each with its own ``output_dir`` under the config's."""
    from palaestra.shared.jobs import load_config
    from palaestra.shared.pipeline import PipelineConfig, stage_configs

    if config_dir is not None and data.get("job") == "pipeline":
        data = {**data, "config_dir": config_dir}  # stage paths are relative to the file
    base = load_config(data, overrides)
    out = []
    for values in itertools.product(*matrix.axes.values()):
        chosen = dict(zip(matrix.axes, values, strict=True))
        merged, extra = copy.deepcopy(data), []
        for axis, value in chosen.items():
            fragment = matrix.arms.get(axis, {}).get(str(value))
            if fragment is not None:
                merged = deep_merge(merged, copy.deepcopy(fragment))
            else:
                extra.append(f"{axis}={json.dumps(value) if not isinstance(value, str) else value}")
        combo = Combination(chosen, base)
        directory = Path(base.output_dir) / combo.dirname
        try:
            combo.cfg = load_config(merged, [*overrides, *extra, f"output_dir={directory}"])
            if isinstance(combo.cfg, PipelineConfig):
                stage_configs(combo.cfg)  # a pipeline's stages resolve too, as `--dry-run` of one config does
        except ConfigError as err:
            raise ConfigError(f"matrix {combo.label}: {err}") from None
        out.append(combo)
    return base, out


def file_combinations(source: str | Path, axes: Sequence[str] = (), overrides: Sequence[str] = ()) -> list[Combination]:
    """Every combination of a config file's matrix (plus ``--matrix`` `axes`), resolved: the runs
    ``palaestra run source`` starts."""
    from palaestra.shared.config import read_yaml

    data, matrix = split_matrix(read_yaml(source), axes)
    if matrix is None:
        raise ConfigError(f"{source}: no 'matrix' section")
    return combinations(data, matrix, overrides, config_dir=str(Path(source).parent))[1]


def config_hash(cfg: JobConfig) -> str:
    """What decides whether a finished combination can be reused: its resolved config, without tracking."""
    return hashlib.sha256(to_yaml(replace(cfg, tracking=replace(cfg.tracking, run_name=None))).encode()).hexdigest()


def finished(combo: Combination) -> dict[str, Any] | None:
    """The recorded result of `combo` when it ran to its end with the same config, else None."""
    path = combo.output_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("config_hash") == config_hash(combo.cfg) else None


def _run_one(item: dict[str, Any]) -> dict[str, Any]:
    """One combination in this process (a Ray task or the driver): run its job, record its result."""
    from palaestra.shared.jobs import run_job

    os.chdir(item["cwd"])  # relative paths mean what they mean to the driver
    combo: Combination = item["combo"]
    summary = run_job(combo.cfg, run_name=combo.label, parent_run_id=item["parent_run_id"])
    kept = {k: v for k, v in summary.items() if isinstance(v, int | float | str) and not isinstance(v, bool)}
    record = {"values": combo.values, "config_hash": config_hash(combo.cfg), "summary": kept, "metrics": {}}
    if summary.get("run_id"):  # the run's metrics too (their last values): a metric the summary does not carry
        from palaestra.shared.tracking import Tracker

        record["metrics"] = Tracker(combo.cfg.tracking, summary["run_id"]).last_metrics()
    combo.output_dir.mkdir(parents=True, exist_ok=True)
    tmp = combo.output_dir / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(combo.output_dir / RESULT_FILE)
    return record


def run_matrix(combos: list[Combination], matrix: MatrixConfig, parent_run_id: str | None = None) -> list[dict]:
    """Run every unfinished combination (Ray tasks at once, or one after another); the records in input order,
    a failed one as ``{"values": ..., "error": ...}``."""
    records: list[dict | None] = [finished(c) for c in combos]
    for combo, record in zip(combos, records, strict=True):
        if record is not None:
            print(f"== matrix {combo.label}: finished before ({combo.output_dir / RESULT_FILE}), not run again")
    todo = [i for i, r in enumerate(records) if r is None]
    items = [{"combo": combos[i], "parent_run_id": parent_run_id, "cwd": os.getcwd()} for i in todo]
    if matrix.parallel and len(items) > 1:
        from palaestra.shared.cluster import TaskFailure, parallel_map

        print(f"== matrix: {len(items)} combination(s) on Ray, {matrix.num_cpus:g} CPU(s) each", flush=True)
        results = parallel_map(
            _run_one,
            items,
            num_cpus=matrix.num_cpus,
            num_gpus=matrix.num_gpus,
            max_retries=0,
            keep_going=True,
            desc="matrix",
            cluster=combos[0].cfg.cluster,
            in_process="matrix.parallel=false",
        )
        for i, result in zip(todo, results, strict=True):
            failed = isinstance(result, TaskFailure)
            records[i] = {"values": combos[i].values, "error": result.error} if failed else result
    else:
        for i, item in zip(todo, items, strict=True):
            print(f"== matrix {combos[i].label}", flush=True)
            records[i] = _run_one(item)
    return [r for r in records if r is not None]


def matrix_table(records: list[dict], matrix: MatrixConfig, metric: str) -> tuple[str, list[dict]]:
    """Per arm: the metric's mean across seeds with its 95% Student t interval, and each seed's value."""
    arms: dict[tuple, list[tuple[Any, float | None, str]]] = {}
    for record in records:
        values = record["values"]
        arm = tuple((k, v) for k, v in values.items() if k != matrix.seed_axis)
        seed = values.get(matrix.seed_axis, "-")
        value = record.get("summary", {}).get(metric, record.get("metrics", {}).get(metric))
        note = record.get("error") or ("" if isinstance(value, int | float) else f"no '{metric}' in its summary")
        arms.setdefault(arm, []).append((seed, float(value) if isinstance(value, int | float) else None, note))
    rows, lines = [], []
    header = ["arm", "n", f"{metric} mean", "95% t interval", f"per {matrix.seed_axis}"]
    for arm, seeds in arms.items():
        numbers = [v for _, v, _ in seeds if v is not None]
        mean = sum(numbers) / len(numbers) if numbers else None
        lo_hi = t_mean_interval(numbers) if len(numbers) >= 2 else None
        per_seed = ", ".join(f"{s}: {_fmt(v) if v is not None else 'failed (' + n + ')'}" for s, v, n in seeds)
        label = " ".join(f"{k}={v}" for k, v in arm) or "(all)"
        rows.append({"arm": label, "n": len(numbers), "mean": mean, "interval": lo_hi, "per_seed": seeds})
        interval = f"[{_fmt(lo_hi[0])}, {_fmt(lo_hi[1])}]" if lo_hi else "-"
        lines.append([label, str(len(numbers)), _fmt(mean) if mean is not None else "-", interval, per_seed])
    table = [header, *lines]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)
    return text, rows


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


def run_config(
    source: str | Path,
    overrides: Sequence[str] = (),
    axes: Sequence[str] = (),
    metric: str | None = None,
    dry_run: bool = False,
) -> int:
    """``palaestra run CONFIG --matrix ...``: resolve every combination, run the unfinished ones under one MLflow
    run, print the table; 0 when every combination has the metric, 1 otherwise."""
    from palaestra.shared.config import read_yaml
    from palaestra.shared.jobs import JOBS
    from palaestra.shared.tracking import Tracker

    data, matrix = split_matrix(read_yaml(source), axes)
    assert matrix is not None
    base, combos = combinations(data, matrix, overrides, config_dir=str(Path(source).parent))
    metric = metric or matrix.metric or JOBS.get(combos[0].cfg.job).metric
    if metric is None:
        raise ConfigError(f"matrix: set 'matrix.metric' (or --metric): a key of job {combos[0].cfg.job}'s summary")
    if dry_run:
        for combo in combos:
            state = "finished, reused" if finished(combo) else "to run"
            print(f"# {combo.label}: output_dir {combo.output_dir} ({state})\n{to_yaml(combo.cfg)}", end="")
        print(f"# {len(combos)} combination(s); table metric: {metric}")
        return 0
    name = f"matrix {base.tracking.run_name or base.job}"
    root = Path(base.output_dir)
    with Tracker.start(base, name=name) as tracker:
        tracker.set_tags({"palaestra.matrix.axes": json.dumps(matrix.axes, default=str)})
        records = run_matrix(combos, matrix, tracker.run_id)
        text, rows = matrix_table(records, matrix, metric)
        tracker.log_text(text, "matrix.txt")
        tracker.log_dict(records, "matrix.json")
        tracker.set_tags({"palaestra.status": "finished"})
        run_id = tracker.run_id
    root.mkdir(parents=True, exist_ok=True)
    (root / "matrix.txt").write_text(text + "\n")
    where = f"MLflow run {run_id} in experiment '{base.tracking.experiment}'" if run_id else "no MLflow run"
    print(f"\ndone: {name} ({len(combos)} combinations, {where}; table in {root / 'matrix.txt'})\n{text}")
    return 0 if all(r["n"] == len(r["per_seed"]) for r in rows) else 1
