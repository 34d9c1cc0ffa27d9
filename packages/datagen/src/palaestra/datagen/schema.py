"""Tool schemas: validation, BFCL-to-JSON-schema normalization, OpenAI tool format.

Environments describe their functions as JSON-schema docs (one dict per
function: ``name``, ``description``, ``parameters`` with ``properties`` and
``required``, optionally ``response``). BFCL's docs use a few non-standard
type names (``dict``, ``float``, ``tuple``, ``any``); `normalize_type` maps
them to JSON-schema ones. `validate_tool_doc` turns a malformed doc into a
one-line `SchemaError` naming the function and the field.

Many BFCL parameters list their allowed values only in the description
(``[Enum]: ["on", "off"]``, ``Options are: economy, business``);
`enum_values` reads both the ``enum`` key and those phrases.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}
TYPE_ALIASES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "any": "string",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "list": "array",
}
_ENUM_LIST_RE = re.compile(r"\[Enum\]:\s*\[([^\]]*)\]")
_ENUM_PLAIN_RE = re.compile(r"(?:\[Enum\]:|Options are:|options:|Here are the options:)\s*([^.\n]+)", re.IGNORECASE)


class SchemaError(ValueError):
    """A tool doc that is not a usable JSON-schema function description."""


def normalize_type(type_name: Any) -> str:
    if not isinstance(type_name, str):
        raise SchemaError(f"type must be a string, got {type_name!r}")
    name = TYPE_ALIASES.get(type_name, type_name)
    if name not in JSON_TYPES:
        raise SchemaError(f"unknown type {type_name!r}")
    return name


def validate_tool_doc(doc: Any) -> dict:
    """Check one function doc; return it (unchanged). Raises `SchemaError` with a one-line reason."""
    if not isinstance(doc, dict):
        raise SchemaError(f"a tool doc must be a mapping, got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        raise SchemaError(f"tool doc has no valid 'name' (an identifier): {name!r}")
    if not isinstance(doc.get("description", ""), str):
        raise SchemaError(f"tool {name!r}: 'description' must be a string")
    params = doc.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise SchemaError(f"tool {name!r}: 'parameters' must be a mapping")
    props = params.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"tool {name!r}: 'parameters.properties' must be a mapping")
    for pname, spec in props.items():
        if not isinstance(spec, dict):
            raise SchemaError(f"tool {name!r}: parameter {pname!r} must be a mapping")
        try:
            normalize_type(spec.get("type", "string"))
        except SchemaError as err:
            raise SchemaError(f"tool {name!r}: parameter {pname!r}: {err}") from None
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        missing = [r for r in required if r not in props] if isinstance(required, list) else required
        raise SchemaError(f"tool {name!r}: 'required' names unknown parameters {missing!r}")
    return doc


def parameters(doc: dict) -> dict[str, dict]:
    return doc.get("parameters", {}).get("properties", {}) or {}


def required(doc: dict) -> list[str]:
    return list(doc.get("parameters", {}).get("required", []) or [])


def response_keys(doc: dict) -> list[str]:
    """Top-level response properties, and those of records in an array property (``orders: [{order_id}]``)."""
    props = (doc.get("response") or {}).get("properties", {}) or {}
    keys = list(props)
    for spec in props.values():
        items = spec.get("items") if isinstance(spec, dict) else None
        if isinstance(items, dict):
            keys += [k for k in items.get("properties", {}) or {} if k not in keys]
    return keys


def _normalize_schema(spec: dict) -> dict:
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "type":
            out[key] = normalize_type(value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: _normalize_schema(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, dict):
            out[key] = _normalize_schema(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def to_openai_tool(doc: dict) -> dict:
    """``{"type": "function", "function": {name, description, parameters}}`` with JSON-schema types."""
    params = _normalize_schema(doc.get("parameters", {"type": "object", "properties": {}}))
    params["type"] = "object"
    params.setdefault("properties", {})
    params.setdefault("required", [])
    return {
        "type": "function",
        "function": {"name": doc["name"], "description": doc.get("description", ""), "parameters": params},
    }


def enum_values(spec: dict) -> list:
    """Allowed values of a parameter, from ``enum`` or from its description; [] if unconstrained."""
    if isinstance(spec.get("enum"), list):
        return list(spec["enum"])
    if spec.get("type") == "array" and isinstance(spec.get("items"), dict) and spec["items"].get("enum"):
        return list(spec["items"]["enum"])
    text = spec.get("description", "") or ""
    match = _ENUM_LIST_RE.search(text)
    if match:
        try:
            return list(json.loads(f"[{match.group(1)}]"))
        except json.JSONDecodeError:
            pass
    match = _ENUM_PLAIN_RE.search(text)
    if match:
        values = [v.strip().strip("'\"") for v in match.group(1).split(",")]
        return [v for v in values if v and len(v) < 40]
    return []


def coerce(value: Any, type_name: str) -> Any:
    """`value` converted to a parameter's JSON type where that is lossless (``"3"`` -> 3 for integer)."""
    kind = TYPE_ALIASES.get(type_name, type_name)
    try:
        if kind == "integer" and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            return int(value)
        if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    except ValueError:
        pass
    return value


def type_matches(value: Any, type_name: str) -> bool:
    kind = TYPE_ALIASES.get(type_name, type_name)
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list | tuple),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    return checks.get(kind, lambda v: True)(value)
