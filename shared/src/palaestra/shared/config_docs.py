"""Every field of a config dataclass with its type, default and docstring (what ``palaestra show JOB`` prints).

A field's docstring is the string literal under it in the class body (the
convention of every config here); Python keeps no such docstrings at run time,
so they are read from the class source with `ast`. Nested sections are walked
with dotted names (``llm.backend``); a list of sections shows its item's
fields as ``envs[].name``.

>>> from dataclasses import dataclass
>>> @dataclass
... class Demo:
...     steps: int = 3
...     '''Optimizer steps.'''
>>> [(d.name, d.type, d.default, d.doc) for d in describe(Demo)]
[('steps', 'int', '3', 'Optimizer steps.')]
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from palaestra.shared.config_checks import RegistryName, marker_of


@dataclass
class FieldDoc:
    name: str
    """Dotted name, as written in an override (``llm.backend``; ``envs[].name`` for an item of a list)."""
    type: str
    default: str
    doc: str


def describe(schema: type, prefix: str = "", defaults: Any = None) -> list[FieldDoc]:
    """`FieldDoc`s of every field of dataclass `schema`, nested sections included, in declaration order."""
    hints = typing.get_type_hints(schema)
    docs = field_docstrings(schema)
    out: list[FieldDoc] = []
    for f in dataclasses.fields(schema):
        hint = hints.get(f.name, Any)
        default = _default(f, defaults)
        section = _dataclass_in(hint)
        doc = docs.get(f.name) or (_class_doc(section) if section else "")
        marker = marker_of(f)
        if isinstance(marker, RegistryName):
            doc = f"{doc} (a name in the {marker.get_registry().kind} registry)".strip()
        if section and not _is_list(hint):
            out.append(FieldDoc(prefix + f.name, section.__name__, "", doc))
            out += describe(section, f"{prefix}{f.name}.", default if dataclasses.is_dataclass(default) else None)
            continue
        out.append(FieldDoc(prefix + f.name, type_name(hint), _show(default), doc))
        if section:  # a list of sections: the item's fields
            out += describe(section, f"{prefix}{f.name}[].")
    return out


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the source of `cls` and its dataclass bases (a subclass's docstring wins)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                out[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return out


def type_name(hint: Any) -> str:
    """A readable type: ``int``, ``str | None``, ``list[EnvSpec]``, ``Reduction {grpo, dapo, dr_grpo}``."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"{hint.__name__} {{{', '.join(m.name for m in hint)}}}"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(hint))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(hint))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def _default(f: dataclasses.Field, defaults: Any) -> Any:
    if defaults is not None:
        return getattr(defaults, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, list):
        value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v for v in value]
    return "None" if value is None else str(value)


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds (itself, optional, or as list items), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    for arg in typing.get_args(hint):
        found = _dataclass_in(arg)
        if found is not None:
            return found
    return None


def _is_list(hint: Any) -> bool:
    return typing.get_origin(hint) in (list, tuple)


def _class_doc(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    return "" if not doc or doc.startswith(cls.__name__ + "(") else doc.splitlines()[0]  # not dataclass's signature
