"""Checks at resolve time: markers that a config class puts on its fields, run by `check_fields` after a
config resolves (config.py), so ``--dry-run`` catches them. `ConfigError` is what every check raises.

- a choice among fixed values is an `enum.StrEnum` field: OmegaConf refuses
  anything else (``mode=selfpaly``: "expected one of [selfplay, ...]; did you
  mean 'selfplay'?"), and the value still compares equal to its string;
- a name chosen from a `Registry` is ``field(default=..., metadata=registry_name(REG))``
  (``REG`` the registry or its ``"module:ATTR"``): an unknown name fails with
  the registry's did-you-mean. Strings, lists of strings and the keys of a
  mapping are checked; ``None`` and direct ``"module:attr"`` references pass;
- the keyword arguments of a named entry, ``metadata=registry_kwargs("name")``
  (``"name"`` the sibling field holding the name): keys the entry's signature
  does not take fail, and parameters annotated
  ``Annotated[str, RegistryName(REG)]`` are checked like a registry name;
  a parameter typed with an enum (nearest choice suggested) or as bool, int,
  float or str takes only such values; an entry's ``check_arguments(options)``
  (its defaults filled in) returns an error across its arguments, or None;
- a keyword parameter holding the keyword arguments of another named entry
  (``source_kwargs`` of the ``task`` env) is annotated
  ``Annotated[dict, EntryKwargs(REG, "source")]`` (``"source"`` the parameter
  naming the entry): keys that entry does not take fail;
- a file name under ``output_dir``, ``metadata=output_file()``: a path that
  leaves ``output_dir`` (``../x``, an absolute path) fails; jobs build such
  paths with `confined_path`;
- anything else, ``metadata=value_check("module:function")``: the function
  gets ``(value, owner)`` and returns an error message or None
  (config.py's `check_non_negative` and `check_positive` are ready-made ones).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import typing
from pathlib import Path
from typing import Any

from palaestra.shared.registry import import_string


class ConfigError(ValueError):
    """A config that cannot be resolved; the message names the offending key."""


_CHECK = "palaestra.check"


class ValueCheck:
    """Marker: ``function(value, owner)`` (a ``"module:function"``) returns an error message or None."""

    def __init__(self, function: str):
        self.function = function

    def check(self, value: Any, owner: Any, key: str, root: Any) -> None:
        message = import_string(self.function)(value, owner)
        if message:
            raise ConfigError(f"invalid value for '{key}': {message}")


def value_check(function: str) -> dict[str, Any]:
    """Field metadata: ``function(value, owner) -> message | None`` (a ``"module:function"``) checks the value."""
    return {_CHECK: ValueCheck(function)}


class RegistryName:
    """Marker: the value is a name registered in `registry` (a `Registry`, or its ``"module:ATTR"``)."""

    def __init__(self, registry: Any):
        self.registry = registry

    def get_registry(self) -> Any:
        return import_string(self.registry) if isinstance(self.registry, str) else self.registry

    def check(self, value: Any, owner: Any, key: str, root: Any) -> None:
        names = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple | dict) else []
        registry = self.get_registry()
        for name in names:
            if isinstance(name, str) and ":" not in name and name not in registry:
                raise ConfigError(f"invalid value for '{key}': {registry.unknown_message(name)}")


class RegistryKwargs:
    """Marker: the value holds keyword arguments of the entry named by the sibling field `name_field`."""

    def __init__(self, name_field: str):
        self.name_field = name_field

    def check(self, value: Any, owner: Any, key: str, root: Any) -> None:
        name = getattr(owner, self.name_field)
        marker = next(f.metadata.get(_CHECK) for f in dataclasses.fields(owner) if f.name == self.name_field)
        if not isinstance(marker, RegistryName):
            raise TypeError(f"registry_kwargs({self.name_field!r}): that field is not a registry_name field")
        registry = marker.get_registry()
        if not isinstance(name, str) or ":" in name or name not in registry or not isinstance(value, dict):
            return
        check_kwargs(registry.get(name), value, f"{registry.kind} '{name}'", key, root)


class EntryKwargs:
    """Marker for a keyword parameter: keyword arguments of the `registry` entry named by parameter `name_param`."""

    def __init__(self, registry: Any, name_param: str):
        self.registry = RegistryName(registry)
        self.name_param = name_param

    def check(self, value: Any, owner: Any, key: str, root: Any) -> None:
        name = owner.get(self.name_param) if isinstance(owner, dict) else getattr(owner, self.name_param, None)
        registry = self.registry.get_registry()
        if not isinstance(name, str) or ":" in name or name not in registry or not isinstance(value, dict):
            return
        check_kwargs(registry.get(name), value, f"{registry.kind} '{name}'", key, root)


class OutputFile:
    """Marker: the value is a path under the job's ``output_dir`` (see `confined_path`)."""

    def check(self, value: Any, owner: Any, key: str, root: Any) -> None:
        confined_path(getattr(root, "output_dir", "."), value, key=key)


def registry_name(registry: Any) -> dict[str, Any]:
    """Field metadata: the field holds a name in `registry` (checked at resolve time, with did-you-mean)."""
    return {_CHECK: RegistryName(registry)}


def registry_kwargs(name_field: str) -> dict[str, Any]:
    """Field metadata: the field holds keyword arguments of the registered entry named in field `name_field`."""
    return {_CHECK: RegistryKwargs(name_field)}


def output_file() -> dict[str, Any]:
    """Field metadata: the field is a file name that must stay under the job's ``output_dir``."""
    return {_CHECK: OutputFile()}


def marker_of(f: dataclasses.Field) -> Any:
    """The check marker a field carries in its metadata (`RegistryName`, `OutputFile`, ...), or None."""
    return f.metadata.get(_CHECK)


def check_fields(cfg: Any, root: Any = None, prefix: str = "") -> None:
    """Run the markers of every field of dataclass `cfg` and of the dataclasses inside it; raise `ConfigError`."""
    root = cfg if root is None else root
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), prefix + f.name
        _check_inside(value, root, key)  # the inner fields first: their errors are the more precise
        marker = f.metadata.get(_CHECK)
        if marker is not None and value is not None:
            marker.check(value, cfg, key, root)


def _check_inside(value: Any, root: Any, key: str) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        check_fields(value, root, key + ".")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_inside(item, root, f"{key}.{i}")
    elif isinstance(value, dict):
        for k, item in value.items():
            _check_inside(item, root, f"{key}.{k}")


def check_kwargs(target: Any, kwargs: dict[str, Any], what: str, key: str, root: Any = None) -> None:
    """Refuse keys `target`'s signature does not take; check its ``Annotated[..., RegistryName(...)]`` parameters."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):  # no signature to check against
        return
    named = [p for p, v in params.items() if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
    if not any(v.kind is v.VAR_KEYWORD for v in params.values()):
        for name in kwargs:
            if name not in named:
                close = difflib.get_close_matches(str(name), named, n=1, cutoff=0.5)
                hint = f"; did you mean '{close[0]}'?" if close else f"; it takes: {', '.join(named) or 'nothing'}"
                raise ConfigError(f"unknown key '{key}.{name}': {what} takes no argument '{name}'{hint}")
    try:
        function = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception:  # unresolvable annotations: nothing more to check
        return
    given = {p: v.default for p, v in params.items() if v.default is not v.empty} | dict(kwargs)
    for name, value in kwargs.items():
        annotation = hints.get(name)
        if (problem := _type_problem(value, annotation)) is not None:
            raise ConfigError(f"invalid value for '{key}.{name}': {problem}")
        for meta in getattr(annotation, "__metadata__", ()):
            if hasattr(meta, "check") and value is not None:
                meta.check(value, given, f"{key}.{name}", root)
    check = getattr(target, "check_arguments", None)  # the entry's own check across its arguments
    if callable(check) and (problem := check(given)):
        raise ConfigError(f"invalid value for '{key}': {what}: {problem}")


def _type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` does not fit a plain parameter type (an enum, bool, int, float or str), or None."""
    if value is None:
        return None
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        choices = [str(m.value) for m in hint]
        if str(value) in choices and isinstance(value, str | enum.Enum):
            return None
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint_ = f"; did you mean '{close[0]}'?" if close else ""
        return f"{value!r} is not one of {', '.join(choices)}{hint_}"
    fits = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }
    if hint in fits and not fits[hint](value):
        return f"expected {hint.__name__}, got {value!r}"
    return None


def confined_path(output_dir: str | Path, *parts: str | Path, key: str = "output") -> Path:
    """``output_dir/parts...``, refusing a path that leaves `output_dir` (``..``, an absolute path, a symlink out)."""
    relative = Path(*parts)
    base = Path(output_dir).resolve()
    if relative.is_absolute() or not (base / relative).resolve().is_relative_to(base):
        raise ConfigError(f"'{key}' ({relative}) leaves output_dir '{output_dir}': a job writes only under output_dir")
    return Path(output_dir) / relative
