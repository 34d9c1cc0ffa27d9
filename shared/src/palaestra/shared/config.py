"""Typed experiment configs: dataclasses resolved with OmegaConf.

A config file is YAML with a ``job:`` key naming a registered job. The job's
dataclass is the schema: ``OmegaConf.structured(schema)`` -> merge the YAML
(after its ``base:`` files, paths relative to the file, base first) -> merge
``key=value`` overrides -> ``OmegaConf.to_object``. Every mistake becomes a
`ConfigError` whose one-line message names the key: an unknown key (with the
nearest known name), a wrong type, a missing required value.

Every job config extends `JobConfig`, so the common sections (seed,
tracking, cluster) look the same in every experiment.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf import errors as oc_errors


class ConfigError(ValueError):
    """A config that cannot be resolved; the message names the offending key."""


@dataclass
class TrackingConfig:
    """Where MLflow records runs."""

    experiment: str = "palaestra"
    """MLflow experiment name."""
    uri: str | None = None
    """Tracking URI; default: a sqlite file ``mlruns/mlflow.db`` under the working directory."""
    artifact_root: str | None = None
    """Artifact location for a new experiment on a local store; default ``mlruns/artifacts``."""
    run_name: str | None = None
    """Name of the run; default: the job name."""
    enabled: bool = True
    """False runs the job without MLflow (metrics go nowhere)."""


@dataclass
class ClusterConfig:
    """Where Ray work runs."""

    address: str | None = None
    """Address of an existing Ray cluster (``auto`` or ``ray://host:port``); None starts a local one."""
    num_cpus: int | None = None
    """CPUs of a local instance (None: all)."""
    num_gpus: int | None = None
    """GPUs of a local instance (None: all that Ray finds)."""
    object_store_mb: int = 256
    """Object store size of a local instance, in MiB."""


@dataclass
class JobConfig:
    """What every job config has; a job's own config subclasses it."""

    job: str = MISSING
    """Name of the registered job (``palaestra jobs`` lists them)."""
    seed: int = 0
    """Seed for Python, NumPy and torch."""
    output_dir: str = "outputs"
    """Where the job writes files that outlive the run (datasets, checkpoints)."""
    torch_threads: int = 0
    """CPU threads of torch in the job's process (0: torch's default). On a small or busy CPU, 1 is often fastest."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping with its ``base:`` files merged under it (paths relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"malformed YAML in {path}{where}: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys, got {type(data).__name__}")
    bases = data.pop("base", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = _deep_merge(merged, read_yaml(path.parent / base))
    return _deep_merge(merged, data)


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve(schema: type, data: dict[str, Any] | DictConfig, overrides: list[str] = ()) -> Any:
    """Validate `data` plus dotlist `overrides` against dataclass `schema`; return an instance."""
    structured = OmegaConf.structured(schema)
    try:
        merged = OmegaConf.merge(structured, data)
        if overrides:
            _check_overrides(overrides)
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_object(merged)
    except oc_errors.OmegaConfBaseException as err:
        raise ConfigError(_explain(err, schema)) from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """A resolved config (dataclass) as plain containers."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": value}`` for every leaf of a config (for MLflow params)."""
    tree = to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key=value")


def _explain(err: oc_errors.OmegaConfBaseException, schema: type) -> str:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, oc_errors.MissingMandatoryValue):
        return f"missing required value '{key}'"
    if isinstance(err, oc_errors.ConfigKeyError | oc_errors.ConfigAttributeError):
        parent, _, leaf = key.rpartition(".")
        known = _keys_at(schema, parent)
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.5)
        hint = f"; did you mean '{parent + '.' if parent else ''}{close[0]}'?" if close else ""
        where = f" in '{parent}'" if parent else ""
        return f"unknown key '{key}'{where}{hint}"
    message = str(err).splitlines()[0]
    return f"invalid value for '{key}': {message}" if key else message


def _keys_at(schema: type, dotted: str) -> list[str]:
    node: Any = OmegaConf.structured(schema)
    for part in filter(None, dotted.split(".")):
        try:
            node = node[int(part)] if isinstance(node, ListConfig) else node[part]
        except Exception:
            return []
    return list(node.keys()) if isinstance(node, DictConfig) else []
