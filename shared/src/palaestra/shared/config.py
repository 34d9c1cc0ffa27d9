"""Typed experiment configs: dataclasses resolved with OmegaConf.

A config file is YAML with a ``job:`` key naming a registered job. The job's
dataclass is the schema: ``OmegaConf.structured(schema)`` -> merge the YAML
(after its ``base:`` files, paths relative to the file, base first) -> merge
``key=value`` overrides -> ``OmegaConf.to_object``. Every mistake becomes a
`ConfigError` whose one-line message names the key: an unknown key (with the
nearest known name), a wrong type, a missing required value.

Every job config extends `JobConfig`, so the common sections (seed,
tracking, cluster) look the same in every experiment.

Checked at resolve time too, through markers on the fields (config_checks.py).

A ``base:`` chain that comes back to a file already in it is a one-line error
naming the cycle. A config file is read as UTF-8 YAML of at most
`MAX_YAML_BYTES`, whose tree (aliases expanded) has at most `MAX_YAML_NODES`
nodes, without an anchor that contains itself: a "billion laughs" file, a
recursive anchor or a binary file is a one-line error, not minutes of work or
a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf import errors as oc_errors

from palaestra.shared.config_checks import ConfigError, check_fields, value_check

MAX_YAML_BYTES = 4 * 2**20
"""The largest config file read (the longest config here is about 25 KB)."""
MAX_YAML_NODES = 200_000
"""The most nodes a config's tree may have with every alias expanded (the longest config here: a few thousand)."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing an anchor used inside itself (a recursive structure)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if isinstance(event, yaml.AliasEvent):
            if anchor in self._open_anchors:
                line = f"line {event.start_mark.line + 1}: " if event.start_mark else ""
                raise ConfigError(f"{line}anchor '&{anchor}' is used inside itself")
            return super().compose_node(parent, index)
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open_anchors.discard(anchor)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes in the tree under `node` with every alias expanded (a shared node counted each time it is used)."""
    if id(node) not in memo:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        memo[id(node)] = min(1 + sum(_expanded_size(c, memo) for c in children), MAX_YAML_NODES + 1)
    return memo[id(node)]


def load_yaml(text: str | bytes, where: str = "config") -> Any:
    """Parse YAML text with the bounds above; every failure is a one-line `ConfigError` naming `where`."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where}: {len(text)} bytes; a config may have at most {MAX_YAML_BYTES}")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{where}: not UTF-8 text (byte {err.start}: {text[err.start : err.start + 1]!r})"
            ) from None
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_YAML_NODES:
            raise ConfigError(f"{where}: more than {MAX_YAML_NODES} values once its aliases are expanded")
        return loader.construct_document(node)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}" if not str(err).startswith(where) else str(err)) from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"malformed YAML in {where}{line}: {getattr(err, 'problem', None) or err}") from None
    finally:
        loader.dispose()


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
    start_timeout_s: float = field(default=120.0, metadata=value_check("palaestra.shared.config:check_positive"))
    """Seconds a local instance may take to start (Ray's own wait is a fixed 30 s, too short on a busy machine)."""
    start_attempts: int = field(default=2, metadata=value_check("palaestra.shared.config:check_positive"))
    """Tries to start a local instance before the run stops with one line naming the cause."""


@dataclass
class JobConfig:
    """What every job config has; a job's own config subclasses it."""

    job: str = MISSING
    """Name of the registered job (``palaestra jobs`` lists them)."""
    seed: int = 0
    """Seed for Python, NumPy and torch."""
    output_dir: str = "outputs"
    """Where the job writes files that outlive the run (datasets, checkpoints)."""
    torch_threads: int = field(default=0, metadata=value_check("palaestra.shared.config:check_non_negative"))
    """CPU threads of torch in the job's process (0: torch's default). On a small or busy CPU, 1 is often fastest."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def read_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML mapping with its ``base:`` files merged under it (paths relative to the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    here = path.resolve()
    if here in _chain:
        cycle = [*_chain[_chain.index(here) :], here]
        raise ConfigError("circular 'base:' " + " -> ".join(str(p) for p in _relative(cycle)))
    if path.stat().st_size > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size} bytes; a config may have at most {MAX_YAML_BYTES}")
    data = load_yaml(path.read_bytes(), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of keys, got {type(data).__name__}")
    bases = data.pop("base", None) or []
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = deep_merge(merged, read_yaml(path.parent / base, (*_chain, here)))
    return deep_merge(merged, data)


def _relative(paths: list[Path]) -> list[Path]:
    cwd = Path.cwd()
    return [p.relative_to(cwd) if p.is_relative_to(cwd) else p for p in paths]


def deep_merge(a: dict, b: dict) -> dict:
    """`b` merged into `a`: mappings merge key by key, anything else (lists included) in `b` replaces."""
    out = dict(a)
    for key, value in b.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve(schema: type, data: dict[str, Any] | DictConfig, overrides: Sequence[str] = ()) -> Any:
    """Validate `data` plus dotlist `overrides` against dataclass `schema`; return an instance."""
    structured = OmegaConf.structured(schema)
    try:
        merged = OmegaConf.merge(structured, data)
        _check_overrides(overrides)
        for item in overrides:  # one by one: a dotted key may index a list (``envs.0.name=x``)
            key, value = item.split("=", 1)
            OmegaConf.update(merged, key, OmegaConf.from_dotlist([f"value={value}"])["value"], merge=True)
        cfg = OmegaConf.to_object(merged)
    except oc_errors.OmegaConfBaseException as err:
        raise ConfigError(_explain(err, schema)) from None
    check_fields(cfg)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """A resolved config (dataclass) as plain containers."""
    tree = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)
    assert isinstance(tree, dict)
    return {str(k): v for k, v in tree.items()}


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


def _check_overrides(overrides: Sequence[str]) -> None:
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
    choice = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", message)
    if choice:  # an enum field: suggest the nearest choice
        close = difflib.get_close_matches(choice[1], choice[2].split(", "), n=1, cutoff=0.5)
        message += f"; did you mean '{close[0]}'?" if close else ""
    return f"invalid value for '{key}': {message}" if key else message


def _keys_at(schema: type, dotted: str) -> list[str]:
    node: Any = OmegaConf.structured(schema)
    for part in filter(None, dotted.split(".")):
        try:
            node = node[int(part)] if isinstance(node, ListConfig) else node[part]
        except Exception:
            return []
    return [str(k) for k in node] if isinstance(node, DictConfig) else []


def check_non_negative(value: Any, owner: Any) -> str | None:
    """A value check: the number must be >= 0."""
    return None if value >= 0 else f"must be >= 0, got {value}"


def check_positive(value: Any, owner: Any) -> str | None:
    """A value check: the number must be > 0."""
    return None if value > 0 else f"must be > 0, got {value}"
