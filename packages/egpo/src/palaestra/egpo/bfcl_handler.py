"""BFCL's own model handler as the decoder of a response (``decoder: bfcl``), and BFCL's runner as its scorer.

A response is decoded and scored as ``bfcl generate`` followed by ``bfcl evaluate`` would do it, by BFCL's code:

1. the handler of the BFCL model key (``bfcl_model``, e.g. ``Qwen/Qwen3-4B-Instruct-2507-FC`` ->
   ``QwenFCHandler``, ``Qwen/Qwen3-4B-Instruct-2507`` -> ``QwenHandler`` in prompting mode) reads the raw text
   with its ``_parse_query_response_prompting``: what it returns as ``model_responses`` is what BFCL's runner
   stores in its result file (`stored_response`; for Qwen the text after ``</think>``);
2. BFCL's eval runner scores that stored text with its own per-entry functions (``_evaluate_single_ast_entry``,
   ``_evaluate_single_relevance_entry``, ``_evaluate_single_multi_turn_entry`` of
   ``bfcl_eval.eval_checker.eval_runner``), which call the handler's ``decode_ast`` / ``decode_execute``.

So a decode failure counts exactly as BFCL counts it: a failed AST entry, "no call" in relevance categories, and
in multi-turn the end of the user turn during the episode (`execute_calls`, BFCL's inference loop) and a skipped
step when the episode is scored. Nothing here re-implements a BFCL rule; only local (OSS) handlers are supported,
because an API model's handler parses API responses, not text.
"""

from __future__ import annotations

import copy
from functools import cache
from types import SimpleNamespace
from typing import Any

from palaestra.egpo.bfcl import require_bfcl

DEFAULT_MODEL = "Qwen/Qwen3-4B-Instruct-2507-FC"
"""BFCL's Qwen3-4B-Instruct-2507 FC entry (`QwenFCHandler`: ``<tool_call>`` JSON blocks, the papers' base model)."""


def model_dir(model: str) -> str:
    """The folder BFCL's runner keeps a model's result and score files in (its key with ``/`` as ``_``)."""
    return model.replace("/", "_")


@cache
def handler(model: str = DEFAULT_MODEL) -> Any:
    """BFCL's handler of `model` (a key of BFCL's ``MODEL_CONFIG_MAPPING``), built as BFCL's eval runner builds it;
    ValueError for an unknown key or an API model."""
    require_bfcl()
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING

    if model not in MODEL_CONFIG_MAPPING:
        import difflib

        close = difflib.get_close_matches(model, list(MODEL_CONFIG_MAPPING), n=3)
        raise ValueError(f"bfcl_model {model!r} is not a model of the installed bfcl-eval; close: {close}")
    from bfcl_eval.eval_checker.eval_runner import get_handler
    from bfcl_eval.model_handler.local_inference.base_oss_handler import OSSHandler

    found = get_handler(model)
    if not isinstance(found, OSSHandler):
        raise ValueError(f"bfcl_model {model!r} is an API model: its handler reads API responses, not model text")
    return found


def check_settings(categories: list[str], model: str, prompt: str, decoder: str) -> None:
    """ValueError for an unknown category, an unknown or API `model`, or a BFCL prompt of the other mode than the
    model's (an FC model's key ends in ``-FC``); ImportError without bfcl-eval."""
    from palaestra.egpo.bfcl import category_kind

    for category in categories:
        category_kind(category)
    fc = is_fc_model(model)
    if prompt == "bfcl_prompting" and fc:
        raise ValueError(f"prompt bfcl_prompting needs a prompting-mode bfcl_model; {model!r} is FC mode")
    if prompt == "bfcl_fc" and decoder == "bfcl" and not fc:
        raise ValueError(f"prompt bfcl_fc needs an FC-mode bfcl_model; {model!r} is prompting mode")


def is_fc_model(model: str) -> bool:
    """Whether BFCL runs `model` in FC mode (tools to the chat template) or in prompting mode (BFCL's system prompt)."""
    return bool(handler(model).is_fc_model)


def first_turn_messages(model: str, entry_id: str, messages: list[dict], functions: list[dict]) -> list[dict]:
    """The first user turn's messages as the handler's prompting path sends them (``_pre_query_processing_prompting``:
    BFCL's system prompt with the function docs for a prompting-mode model; nothing added in FC mode)."""
    entry = {"id": entry_id, "question": [copy.deepcopy(list(messages))], "function": copy.deepcopy(functions)}
    handler(model)._pre_query_processing_prompting(entry)
    return list(entry["question"][0])


def stored_response(model: str, text: str) -> Any:
    """What BFCL's runner stores of a raw model response: the handler's ``model_responses``."""
    api = SimpleNamespace(
        choices=[SimpleNamespace(text=text)], usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0)
    )
    return handler(model)._parse_query_response_prompting(api)["model_responses"]


def decode_ast(model: str, stored: Any) -> tuple[list[dict] | None, str | None]:
    """The handler's ``decode_ast`` of a stored response: ``(calls as {name: {param: value}}, None)`` or
    ``(None, error)``."""
    from bfcl_eval.constants.enums import ReturnFormat

    try:
        return handler(model).decode_ast(stored, ReturnFormat.PYTHON, has_tool_call_tag=False), None
    except Exception as err:  # BFCL's runner catches everything here: a failed decode
        return None, f"{type(err).__name__}: {err}"


def execute_calls(model: str, stored: Any) -> tuple[list[str], str | None]:
    """The call strings BFCL's multi-turn inference loop executes for a stored response (the handler's
    ``decode_execute``); ``[]`` (with the error) where it ends the user turn: a failed or an empty decode."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

    try:
        calls = handler(model).decode_execute(stored, has_tool_call_tag=False)
    except Exception as err:
        return [], f"{type(err).__name__}: {err}"
    return ([], None) if is_empty_execute_response(calls) else (list(calls), None)


def score_single_turn(
    model: str, entry_id: str, category: str, stored: Any, functions: list[dict], ground_truth: list | None
) -> dict[str, Any]:
    """BFCL's runner's verdict on one stored single-turn response: ``{"valid", "error_type", "decoded"}``."""
    require_bfcl()
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.utils import is_relevance_or_irrelevance

    h, name = handler(model), model_dir(model)
    prompt = {"id": entry_id, "function": copy.deepcopy(functions)}
    if is_relevance_or_irrelevance(category):
        result = eval_runner._evaluate_single_relevance_entry(h, entry_id, stored, prompt, name, category)
    else:
        result = eval_runner._evaluate_single_ast_entry(
            h,
            entry_id,
            stored,
            copy.deepcopy(ground_truth),
            prompt,
            name,
            category,
            language=Language.PYTHON,
            return_format=ReturnFormat.PYTHON,
            has_tool_call_tag=False,
        )
    decoded, error = decode_ast(model, stored)
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type"), "decoded": decoded, "error": error}


def score_multi_turn(
    model: str, entry: dict, responses: list[list[Any]], ground_truth: list[list[str]], key: str
) -> dict[str, Any]:
    """BFCL's runner's verdict on one multi-turn entry's stored responses (per user turn, per step); `key` names
    the checker's environment instances (dropped afterwards by the caller)."""
    require_bfcl()
    from bfcl_eval.eval_checker import eval_runner

    category = entry["id"].rsplit("_", 1)[0]
    try:
        result = eval_runner._evaluate_single_multi_turn_entry(
            handler(model), entry["id"], responses, ground_truth, copy.deepcopy(entry), key, category
        )
    except Exception as err:  # BFCL's checker asserting on an odd episode is a failed episode, not a crash
        return {"valid": False, "error_type": f"checker_error: {type(err).__name__}: {err}"}
    error = result.get("error") or {}
    return {"valid": bool(result["valid"]), "error_type": error.get("error_type") if isinstance(error, dict) else None}
