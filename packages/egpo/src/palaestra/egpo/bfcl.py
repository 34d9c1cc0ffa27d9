"""Access to BFCL (the ``bfcl-eval`` package): its data, its official checkers, its executable environments.

bfcl-eval is installed without its dependencies (see the package README): `require_bfcl` imports it
and turns a missing install into one clear error. Nothing here changes BFCL's checking logic; this
module only loads its files and calls its functions.

Categories handled (BFCL v4 names):

- single-turn AST: ``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``, ``live_simple``,
  ``live_multiple``, ``live_parallel``, ``live_parallel_multiple`` (Java/JavaScript: ``simple_java``,
  ``simple_javascript`` are not in our prompt format's scope: their values are strings of Java/JS code);
- relevance: ``irrelevance``, ``live_irrelevance``, ``live_relevance``;
- multi-turn: ``multi_turn_base``, ``multi_turn_miss_func``, ``multi_turn_miss_param``,
  ``multi_turn_long_context``.

Not runnable offline, and skipped with a message: ``web_search_*`` (live web), ``memory_*`` (needs
sentence-transformers embeddings from the hub), ``format_sensitivity`` (other prompt formats).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from functools import cache
from typing import Any

AST_CATEGORIES = [
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
]
RELEVANCE_CATEGORIES = ["irrelevance", "live_irrelevance", "live_relevance"]
MULTI_TURN_CATEGORIES = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
OFFLINE_SKIPPED = {
    "web_search": "needs live web search (SerpAPI)",
    "memory": "needs sentence-transformers embeddings and the hub",
    "format_sensitivity": "measures other prompt formats than ours",
    "simple_java": "values are Java source strings, outside our prompt format",
    "simple_javascript": "values are JavaScript source strings, outside our prompt format",
}
ALL_CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES + MULTI_TURN_CATEGORIES
CHECKER_MODEL_NAME = "Qwen_Qwen3-4B-Instruct-2507-FC"
"""Model key passed to BFCL's checkers: a Qwen FC entry (keeps dotted function names, as our format does)."""

INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23 && pip install 'palaestra-egpo[bfcl]'"


class BFCLNotInstalled(ImportError):
    """bfcl-eval (or a dependency of its checkers) is missing."""


@cache
def require_bfcl() -> Any:
    """Import bfcl-eval's checkers once; a clear one-line error if they cannot be imported."""
    try:
        importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
        importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
        return importlib.import_module("bfcl_eval.utils")
    except ImportError as err:
        message = f"BFCL's checkers cannot be imported ({err}); install them with: {INSTALL_HINT}"
        raise BFCLNotInstalled(message) from None


def category_kind(category: str) -> str:
    """``ast`` | ``relevance`` | ``multi_turn``; a clear error for a skipped or unknown category."""
    if category in AST_CATEGORIES:
        return "ast"
    if category in RELEVANCE_CATEGORIES:
        return "relevance"
    if category in MULTI_TURN_CATEGORIES:
        return "multi_turn"
    for prefix, why in OFFLINE_SKIPPED.items():
        if category.startswith(prefix):
            raise ValueError(f"BFCL category {category!r} is not supported here: {why}")
    import difflib

    close = difflib.get_close_matches(category, ALL_CATEGORIES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {ALL_CATEGORIES}"
    raise ValueError(f"unknown BFCL category {category!r}{hint}")


@cache
def _load(category: str) -> tuple[list[dict], list[dict] | None]:
    utils = require_bfcl()
    # the language hint is part of BFCL's own prompt for these entries ("Note that the provided function ...")
    entries = utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    answers = None if category_kind(category) == "relevance" else utils.load_ground_truth_entry(category)
    return entries, answers


def load_category(category: str, limit: int | None = None) -> list[tuple[dict, list | None]]:
    """``(entry, ground_truth)`` pairs of a category in BFCL's order (ground truth None for relevance)."""
    import copy

    category_kind(category)
    entries, answers = _load(category)
    by_id = {a["id"]: a["ground_truth"] for a in answers} if answers else {}
    pairs = [(copy.deepcopy(e), copy.deepcopy(by_id.get(e["id"]))) for e in entries]
    return pairs[:limit] if limit else pairs


def official_ast_check(functions: list[dict], decoded: list[dict], ground_truth: list, category: str) -> dict:
    """BFCL's own ``ast_checker`` on decoded calls (``[{name: {param: value}}]``)."""
    require_bfcl()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker(functions, decoded, ground_truth, Language.PYTHON, category, CHECKER_MODEL_NAME)


def official_relevance_check(decoded: list[dict] | None, category: str) -> bool:
    """BFCL's relevance rule: irrelevance passes iff no call was decoded; relevance iff one was."""
    utils = require_bfcl()
    contains_call = decoded is not None and not utils.is_empty_output(decoded)
    return not contains_call if "irrelevance" in category else contains_call


# ---- multi-turn: environments and call strings -------------------------------------------------


@cache
def _signature(class_name: str, method: str) -> inspect.Signature | None:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    fn = getattr(cls, method, None)
    return inspect.signature(fn) if fn else None


def parse_call_string(text: str, involved_classes: list[str]) -> tuple[str, dict]:
    """A BFCL ground-truth call string as ``(name, keyword arguments)``; positional ones are named by the
    environment method's signature (our format has keyword arguments only)."""
    require_bfcl()
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {text!r}")
    name = ast.unparse(node.func)
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:
        params = None
        for cls in involved_classes:
            sig = _signature(cls, name)
            if sig:
                params = [p for p in sig.parameters if p != "self"]
                break
        if params is None:
            raise ValueError(f"cannot name positional arguments of {name!r}")
        for param, arg in zip(params, node.args):
            kwargs[param] = ast.literal_eval(arg)
    return name, kwargs
