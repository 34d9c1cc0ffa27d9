"""One registry class for everything that is chosen by name in a config.

A `Registry[T]` maps names to objects. Entries come from three places:

- the `@registry.register("name")` decorator, which refuses a duplicate name;
- a `"package.module:attr"` string, imported only when first looked up
  (so heavy backends cost nothing until chosen);
- an entry-point group (``palaestra.<kind>``) through which installed
  packages add their own entries; each entry point names a module whose
  import registers its entries;
- `register_in(group, name, "module:attr")`, which adds to the registry of an
  entry-point group without importing the module that defines the registry
  (a plugin's way into a registry whose module imports torch).

`Registry.peek` gives an entry as registered, a lazy string not imported, so
that listing names and their summaries (``palaestra jobs``) imports nothing.

Unknown names raise `UnknownNameError` listing the nearest known names.

>>> colors = Registry("color")
>>> @colors.register("red")
... def red():
...     return "#f00"
>>> colors.get("red")()
'#f00'
>>> colors.get("rde")  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
...
palaestra.shared.registry.UnknownNameError: unknown color 'rde'; did you mean 'red'?
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")

_DEFERRED: dict[str, list[tuple[str, str]]] = {}
"""Entry-point group -> the ``(name, "module:attr")`` entries `register_in` added for its registries."""


def register_in(group: str, name: str, target: str) -> None:
    """Register the lazy `target` (``"module:attr"``) under `name` in every registry of entry-point group `group`,
    present or future, without importing the module that defines the registry."""
    _DEFERRED.setdefault(group, []).append((name, target))


class UnknownNameError(KeyError):
    """A name that is not registered; the message suggests the nearest ones."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class DuplicateNameError(ValueError):
    """A second registration under a name that is taken."""


def import_string(path: str):
    """Import ``"package.module:attr"`` (or ``"package.module.attr"``)."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import {module_name!r} (from {path!r}): {err}") from err
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as err:
        raise ImportError(f"{module_name!r} has no attribute {attr!r} (from {path!r})") from err
    return obj


class Registry(Generic[T]):
    """Names -> objects, with lazy imports, plugins and did-you-mean."""

    def __init__(self, kind: str, entry_point_group: str | None = None):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, T | str] = {}
        self._plugins_loaded = entry_point_group is None
        self._deferred_taken = 0  # how many of the group's `register_in` entries this registry holds

    def register(self, name: str, obj: T | str | None = None) -> Callable[[T], T]:
        """Register `obj` under `name`; without `obj`, return a decorator."""
        if obj is not None:
            self._add(name, obj)
            return lambda x: x

        def decorator(target: T) -> T:
            self._add(name, target)
            return target

        return decorator

    def _add(self, name: str, obj: T | str) -> None:
        existing = self._entries.get(name)
        if isinstance(existing, str) and _defined_in(obj, existing.split(":")[0]):
            existing = None  # a lazy "module:attr" entry, replaced by what its module registers on import
        elif isinstance(obj, str) and existing is not None and _defined_in(existing, obj.split(":")[0]):
            return  # the lazy entry of what its module has already registered
        if existing is not None and existing is not obj and existing != obj and not _same_target(existing, obj):
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered ({existing!r})")
        self._entries[name] = obj

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The object registered under `name`, importing it if given as a string."""
        if name not in self._entries:
            self._load_plugins()
        if name not in self._entries:
            if ":" in name:  # a direct "module:attr" reference needs no registration
                return import_string(name)
            raise UnknownNameError(self.unknown_message(name))
        entry = self._entries[name]
        if isinstance(entry, str):
            imported = import_string(entry)
            current = self._entries[name]  # importing may have registered the entry itself (a decorator)
            entry = current if not isinstance(current, str) else imported
            self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        """The registered names (plugins loaded), without broken plugins."""
        self._load_plugins()
        return sorted(n for n in self._entries if not n.startswith("<broken"))

    def __contains__(self, name: str) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def broken_plugins(self) -> dict[str, str]:
        """Entry points of the group that failed to load: their name -> ``"module (error)"``."""
        self._load_plugins()
        return {n[len("<broken:") : -1]: str(e) for n, e in self._entries.items() if n.startswith("<broken:")}

    def peek(self, name: str) -> T | str:
        """The entry under `name` as it stands: the object, or its ``"module:attr"`` string if not imported yet."""
        self._load_plugins()
        if name not in self._entries:
            raise UnknownNameError(self.unknown_message(name))
        return self._entries[name]

    def _load_plugins(self) -> None:
        self._take_deferred()
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.entry_point_group or ""):
            try:
                ep.load()  # importing the module registers its entries
            except Exception as err:  # a broken plugin must not hide the others
                self._entries.setdefault(f"<broken:{ep.name}>", f"{ep.value} ({err})")
        self._take_deferred()

    def _take_deferred(self) -> None:
        deferred = _DEFERRED.get(self.entry_point_group or "", [])
        for name, target in deferred[self._deferred_taken :]:
            self._add(name, target)
        self._deferred_taken = len(deferred)

    def unknown_message(self, name: str) -> str:
        """``unknown <kind> 'name'; did you mean ...?`` (or the known names), for errors about `name`."""
        self._load_plugins()
        known = [n for n in self._entries if not n.startswith("<broken")]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        if close:
            hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
        else:
            hint = "known: " + ", ".join(sorted(known)) if known else f"no {self.kind}s are registered"
        return f"unknown {self.kind} {name!r}; {hint}"


def _same_target(a: object, b: object) -> bool:
    """A module imported twice (e.g. by path and by name) re-registers the same definition: allow that."""
    return _definition_site(a) is not None and _definition_site(a) == _definition_site(b)


def _defined_in(obj: object, module: str) -> bool:
    """Whether `obj` (a Job: its function) is defined in `module`."""
    return not isinstance(obj, str) and getattr(getattr(obj, "run", obj), "__module__", None) == module


def _definition_site(obj: object) -> tuple | None:
    obj = getattr(obj, "run", obj)  # a Job is identified by its function
    code = getattr(obj, "__code__", None)
    if isinstance(obj, str) or code is None:
        return None
    return obj.__module__, getattr(obj, "__qualname__", None), code.co_filename, code.co_firstlineno
