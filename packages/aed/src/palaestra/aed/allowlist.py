"""The first layer in front of LLM-written reward and recognizer code: a static allow-list check.

`static_check` parses the code and refuses anything outside the allow-list:
statements and expressions of plain arithmetic/logic (no import, class, with,
try, global, lambda, walrus, f-string); names limited to the code's own
variables, `math` and a few pure builtins (`SAFE_BUILTINS`), none of which may
be rebound (assignment, loop or comprehension target, parameter, function
name); attributes only ``math.*`` and a few dict and str methods, never one
starting with ``_``, a frame or code attribute (`FORBIDDEN_ATTRS`) or
``format``/``format_map``; no string holding ``__``. It must define
``reward(state)`` (or ``recognize(record)``). `ALLOWED_TEXT` says the same to
the LLM. `palaestra.aed.sandbox` runs what passes, behind layers of its own.
"""

from __future__ import annotations

import ast

SAFE_BUILTINS = (
    "abs",
    "min",
    "max",
    "sum",
    "len",
    "range",
    "float",
    "int",
    "bool",
    "round",
    "pow",
    "enumerate",
    "zip",
    "sorted",
    "any",
    "all",
    "dict",
    "list",
    "tuple",
    "str",
    "isinstance",
)
DICT_METHODS = ("get", "items", "keys", "values")
STR_METHODS = ("startswith", "endswith", "split", "lower", "upper", "strip", "count", "replace")
"""Methods the code may call on dicts and strings (read-only: they build new values)."""
FORBIDDEN_ATTRS = frozenset(
    {"format", "format_map", "mro", "f_back", "f_globals", "f_locals", "f_builtins", "f_code", "f_trace"}
    | {f"{p}_{a}" for p in ("gi", "cr", "ag") for a in ("frame", "code", "await", "yieldfrom")}
    | {"tb_frame", "tb_next", "func_globals", "func_code"}
)
"""Refused on anything, on top of the allow-list: frames, code objects, format-string field access."""
ALLOWED_NODES = (
    ast.Module,
    ast.FunctionDef,
    ast.arguments,
    ast.arg,
    ast.Return,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.If,
    ast.IfExp,
    ast.For,
    ast.While,
    ast.Break,
    ast.Continue,
    ast.Pass,
    ast.Expr,
    ast.Compare,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Call,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.Constant,
    ast.Subscript,
    ast.Attribute,
    ast.Dict,
    ast.List,
    ast.Tuple,
    ast.ListComp,
    ast.GeneratorExp,
    ast.comprehension,
    ast.keyword,
    ast.Slice,
    ast.operator,
    ast.boolop,
    ast.cmpop,
    ast.unaryop,
    ast.expr_context,
)


class RewardCodeError(RuntimeError):
    """Reward code refused or failed; ``reason`` is a one-line explanation."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def static_check(code: str, entry: str = "reward") -> None:
    """Refuse code outside the allow-list, or without a top-level ``<entry>(arg)`` (raises `RewardCodeError`)."""
    if len(code) > 20_000:
        raise RewardCodeError(f"rejected: code is {len(code)} characters (limit 20000)")
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        raise RewardCodeError(f"syntax error at line {err.lineno}: {err.msg}") from None
    except (MemoryError, RecursionError) as err:  # e.g. 20k characters of nested unary/binary operators
        raise RewardCodeError(f"rejected: code nested too deeply for the parser ({type(err).__name__})") from None
    reserved = {"math", *SAFE_BUILTINS, "True", "False", "None"}
    bound = set(reserved)
    for node in ast.walk(tree):  # forbidden statements first, then names: "open" says more than ".write"
        if not isinstance(node, ALLOWED_NODES):
            raise RewardCodeError(
                f"rejected: {type(node).__name__} is not allowed (line {getattr(node, 'lineno', '?')})"
            )
    for node in ast.walk(tree):
        names: list[tuple[str, int]] = []
        if isinstance(node, ast.FunctionDef):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            names = [(node.name, node.lineno)] + [(a.arg, a.lineno) for a in args]
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names = [(node.id, node.lineno)]
        for name, line in names:
            if name in reserved:
                raise RewardCodeError(f"rejected: '{name}' cannot be rebound (line {line})")
            bound.add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and (node.id not in bound or node.id.startswith("_")):
            raise RewardCodeError(f"rejected: name '{node.id}' is not allowed (line {node.lineno})")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (node.decorator_list or node.args.vararg or node.args.kwarg):
            raise RewardCodeError(f"rejected: decorators and *args/**kwargs are not allowed (line {node.lineno})")
        if isinstance(node, ast.Attribute):
            on_math = isinstance(node.value, ast.Name) and node.value.id == "math"
            allowed = on_math or node.attr in DICT_METHODS or node.attr in STR_METHODS
            if node.attr.startswith("_") or node.attr in FORBIDDEN_ATTRS or not allowed:
                raise RewardCodeError(f"rejected: attribute '.{node.attr}' is not allowed (line {node.lineno})")
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if "__" in text:
                raise RewardCodeError(f"rejected: string holding '__' {text[:40]!r} (line {node.lineno})")
    top = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not top or len(top[0].args.args) != 1:
        arg = "state" if entry == "reward" else "record"
        raise RewardCodeError(f"rejected: the code must define a top-level function {entry}({arg})")


ALLOWED_TEXT = f"""\
Reward and recognizer code may use: plain Python statements (def, return, =, +=, if/elif/else, for, while, \
break, continue, pass), arithmetic, comparisons, and/or/not, conditional expressions, list/dict/tuple literals, \
subscripts and slices, list comprehensions and generator expressions; the `math` module (math.sqrt, math.exp, ...; \
no import statement); the builtins {", ".join(SAFE_BUILTINS)}; the dict methods {", ".join(DICT_METHODS)} and the \
string methods {", ".join(STR_METHODS)}. Nothing else: no import, class, lambda, try/with, global, f-strings, \
str.format, no other attribute, no name starting with "_", and `math` and the builtins above cannot be reassigned \
(not as a variable, loop variable or parameter either).
"""
