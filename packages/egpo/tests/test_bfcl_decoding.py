"""``decoder: bfcl`` against BFCL's own generate-and-evaluate path, on a corpus of well-formed and malformed outputs.

The corpus: each BFCL test entry's ground-truth calls (or, where no call is due, a call of its first function)
written in many forms, good and bad (missing / renamed ``arguments``, a ``"parameters"`` key, JSON-encoded string
arguments, text around the tags, two calls in one tag, wrong types, an unknown function, empty or broken JSON,
single quotes, compact tags, no call at all).

The reference path runs only BFCL's code: the handler's own ``inference`` (``bfcl generate``'s, with the model's
completion stubbed to return the corpus text), the handler's own ``write`` of the result file, then BFCL's
``eval_runner.runner`` (``bfcl evaluate``) on those files. Our path: `score_single_turn` / `BFCLMultiTurnEnv` with
``decoder="bfcl"`` on the same raw text, and `write_run_files` for our result files. Every verdict, and every
stored response, must be equal.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(not importlib.util.find_spec("bfcl_eval"), reason="bfcl-eval not installed")

MODEL = "Qwen/Qwen3-4B-Instruct-2507-FC"
SINGLE = {"simple_python": 6, "multiple": 4, "parallel": 4, "parallel_multiple": 3, "irrelevance": 6,
          "live_simple": 3, "live_relevance": 3}  # fmt: skip


def _block(obj, sep="\n") -> str:
    body = obj if isinstance(obj, str) else json.dumps(obj)
    return f"<tool_call>{sep}{body}{sep}</tool_call>"


def _wrong_types(args: dict) -> dict:
    return {k: (str(v) if isinstance(v, int | float) and not isinstance(v, bool) else [v]) for k, v in args.items()}


FORMS = {
    "good": lambda cs: "<think>ok</think>\n" + "\n".join(_block(c) for c in cs),
    "good_no_think": lambda cs: "\n".join(_block(c) for c in cs),
    "unclosed_think": lambda cs: "<think>I will call\n" + "\n".join(_block(c) for c in cs),
    "missing_arguments": lambda cs: "\n".join(_block({"name": c["name"]}) for c in cs),
    "renamed_arguments": lambda cs: "\n".join(_block({"name": c["name"], "args": c["arguments"]}) for c in cs),
    "parameters_key": lambda cs: "\n".join(_block({"name": c["name"], "parameters": c["arguments"]}) for c in cs),
    "string_arguments": lambda cs: "\n".join(
        _block({"name": c["name"], "arguments": json.dumps(c["arguments"])}) for c in cs
    ),
    "text_around": lambda cs: "<think>t</think>\nSure!\n" + "\n".join(_block(c) for c in cs) + "\nDone.",
    "two_in_one_tag": lambda cs: _block("\n".join(json.dumps(c) for c in (cs if len(cs) > 1 else cs + cs))),
    "list_in_one_tag": lambda cs: _block(json.dumps(cs)),
    "wrong_types": lambda cs: "\n".join(
        _block({"name": c["name"], "arguments": _wrong_types(c["arguments"])}) for c in cs
    ),
    "unknown_function": lambda cs: "\n".join(_block({**c, "name": c["name"] + "_x"}) for c in cs),
    "empty_json": lambda cs: _block(""),
    "empty_object": lambda cs: _block("{}"),
    "broken_json": lambda cs: _block('{"name": "' + cs[0]["name"] + '", "arguments": {'),
    "good_then_broken": lambda cs: "\n".join(_block(c) for c in cs) + "\n" + _block("{broken"),
    "single_quotes": lambda cs: "\n".join(_block(repr(c)) for c in cs),
    "compact": lambda cs: "".join(_block(c, sep="") for c in cs),
    "plain_text": lambda cs: "<think>none fits</think>I cannot help with that.",
}


# the paper's format (`fc_binary`'s first condition), judged by hand per form: <think>...</think>, then only
# <tool_call> blocks each holding one JSON object with a name, or a plain answer
FORMAT_OK = {"good": True, "good_no_think": False, "unclosed_think": False, "missing_arguments": True,
             "renamed_arguments": True, "parameters_key": True, "string_arguments": True, "text_around": False,
             "two_in_one_tag": False, "list_in_one_tag": False, "wrong_types": True, "unknown_function": True,
             "empty_json": False, "empty_object": False, "broken_json": False, "good_then_broken": False,
             "single_quotes": False, "compact": True, "plain_text": True}  # fmt: skip


def _with_think(form: str, text: str) -> str:
    """The corpus text with a think block in front where it has none (BFCL stores the same text after it)."""
    return text if "<think>" in text or form == "good_no_think" else "<think>t</think>\n" + text


def _calls(task) -> list[dict]:
    from palaestra.egpo.tasks import canonical_calls

    calls = canonical_calls(task.ground_truth, task.tools) if task.ground_truth else []
    return calls or [{"name": task.tools[0]["name"], "arguments": {}}]


def _api(text: str):
    return SimpleNamespace(choices=[SimpleNamespace(text=text)], usage=SimpleNamespace(prompt_tokens=1,
                           completion_tokens=1))  # fmt: skip


def _bfcl_generate(entries: list[dict], texts: dict[str, list[str]], result_dir) -> None:
    """BFCL's own generation: a fresh handler's ``inference`` per entry, the model's completions taken in order
    from ``texts[id]`` (then "Done."), results written by the handler's ``write`` as ``bfcl generate`` does."""
    from bfcl_eval.eval_checker.eval_runner import get_handler

    from palaestra.egpo.multiturn import _drop_instances

    handler = get_handler(MODEL)
    for entry in entries:
        queue = list(texts[entry["id"]])
        handler._query_prompting = lambda data, q=queue: (_api(q.pop(0) if q else "Done."), 0.0)
        result, _ = handler.inference(copy.deepcopy(entry), include_input_log=False, exclude_state_log=True)
        handler.write({"id": entry["id"], "result": result}, result_dir=result_dir)
    _drop_instances(handler.model_name_underline_replaced)


def _bfcl_evaluate(result_dir, score_dir, categories) -> dict[str, set[str]]:
    """``bfcl evaluate`` on the files: the failed ids per category."""
    from bfcl_eval.eval_checker.eval_runner import runner

    from palaestra.egpo.bfcl_handler import model_dir
    from palaestra.egpo.multiturn import _drop_instances

    score_dir.mkdir(parents=True, exist_ok=True)
    runner([model_dir(MODEL)], categories, result_dir, score_dir, allow_missing=True)
    _drop_instances(model_dir(MODEL))
    failed = {}
    for category in categories:
        (path,) = score_dir.glob(f"{model_dir(MODEL)}/*/BFCL_v4_{category}_score.json")
        failed[category] = {json.loads(line)["id"] for line in path.read_text().splitlines()[1:]}
    return failed


def _results(root, category) -> dict[str, object]:
    from palaestra.egpo.bfcl_handler import model_dir

    (path,) = root.glob(f"{model_dir(MODEL)}/*/BFCL_v4_{category}_result.json")
    return {r["id"]: r["result"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow  # about 45 CPU-seconds: 19 runs of BFCL's generate and evaluate
def test_single_turn_verdicts_equal_bfcls_generate_and_evaluate(tmp_path):
    from palaestra.egpo.bfcl import load_category
    from palaestra.egpo.bfcl_results import write_run_files
    from palaestra.egpo.eval import score_single_turn
    from palaestra.egpo.reward import fc_binary
    from palaestra.egpo.tasks import load_bfcl

    cases = agree = same_file = reward_agree = 0
    disagreements, reward_disagreements, rewards = [], [], {}
    verdicts_by_form: dict[str, list[bool]] = {}
    for form, write in FORMS.items():
        texts, ours, records = {}, {}, {}
        for category, n in SINGLE.items():
            records[category] = []
            for task in load_bfcl(category, n):
                text = write(_calls(task))
                texts[task.id] = [text]
                verdict = score_single_turn(task, text, "bfcl", MODEL)
                ours[task.id] = verdict["valid"]
                rewards[task.id] = fc_binary(task, _with_think(form, text))
                records[category].append({"id": task.id, "outputs": [text], "valid": verdict["valid"]})
        entries = [e for c, n in SINGLE.items() for e, _ in load_category(c, n)]
        _bfcl_generate(entries, texts, tmp_path / form / "bfcl" / "result")
        failed = _bfcl_evaluate(tmp_path / form / "bfcl" / "result", tmp_path / form / "bfcl" / "score", list(SINGLE))
        write_run_files(tmp_path / form / "ours", records, model="m", bfcl_model=MODEL)
        for category in SINGLE:
            theirs_files = _results(tmp_path / form / "bfcl" / "result", category)
            ours_files = _results(tmp_path / form / "ours" / "result", category)
            for entry_id, valid in ((r["id"], r["valid"]) for r in records[category]):
                official = entry_id not in failed[category]
                cases += 1
                agree += official == valid
                same_file += theirs_files[entry_id] == ours_files[entry_id]
                verdicts_by_form.setdefault(form, []).append(official)
                if official != valid:
                    disagreements.append((form, entry_id, official, valid))
                # the strict reward: 1 exactly when BFCL accepts and the paper's format holds
                reward, info = rewards[entry_id]
                reward_agree += reward == float(official and FORMAT_OK[form])
                if reward != float(official and FORMAT_OK[form]):
                    reward_disagreements.append((form, entry_id, official, reward, info["reason"]))
    n_entries = sum(SINGLE.values())
    assert cases == len(FORMS) * n_entries == 19 * 29, cases
    assert agree == cases, f"{len(disagreements)} of {cases} verdicts differ from BFCL's: {disagreements[:10]}"
    assert same_file == cases, f"{cases - same_file} of {cases} stored responses differ from BFCL's result files"
    assert reward_agree == cases, f"fc_binary differs on {len(reward_disagreements)}: {reward_disagreements[:10]}"
    # the corpus separates: BFCL accepts the well-formed calls and rejects most malformed ones
    accepted = {form: sum(v) for form, v in verdicts_by_form.items()}
    assert accepted["good"] >= n_entries - 6  # irrelevance entries reject any call
    for form in ("missing_arguments", "parameters_key", "string_arguments", "broken_json", "single_quotes"):
        assert accepted[form] <= SINGLE["irrelevance"] + 1, (form, accepted[form])  # only "no call" passes
    print(f"\n{cases} cases ({len(FORMS)} forms x {n_entries} entries): verdicts, stored responses and fc_binary all "
          f"equal to BFCL's runner; accepted per "
          f"form: {accepted}")  # fmt: skip


MULTI = {"multi_turn_base": 3, "multi_turn_miss_param": 2}
MT_FORMS = ["good", "missing_arguments", "parameters_key", "string_arguments", "text_around", "two_in_one_tag",
            "unknown_function", "broken_json", "single_quotes", "compact", "good_then_broken"]  # fmt: skip


def _script(entry, truth, write) -> list[str]:
    """A model's responses for an entry: per turn, each ground-truth call in `write`'s form, then "Done."."""
    from palaestra.egpo.bfcl import parse_call_string

    out = []
    for turn in truth:
        for call in turn:
            name, args = parse_call_string(call, entry["involved_classes"])
            out.append(write([{"name": name, "arguments": args}]))
        out.append("Done.")
    return out


@pytest.mark.slow  # about 35 CPU-seconds
def test_multi_turn_verdicts_equal_bfcls_generate_and_evaluate(tmp_path):
    from palaestra.egpo.bfcl import load_category
    from palaestra.egpo.bfcl_results import write_run_files
    from palaestra.egpo.multiturn import BFCLMultiTurnEnv

    cases = agree = same_file = 0
    disagreements, accepted = [], {}
    for form in MT_FORMS:
        texts, records = {}, {}
        for category, n in MULTI.items():
            records[category] = []
            for entry, truth in load_category(category, n):
                texts[entry["id"]] = script = _script(entry, truth, FORMS[form])
                env = BFCLMultiTurnEnv(entry, truth, decoder="bfcl", prompt="bfcl_fc", bfcl_model=MODEL)
                env.reset(0)
                queue, step = list(script), None
                for _ in range(200):
                    env.observe("agent")
                    step = env.step(queue.pop(0) if queue else "Done.")
                    if step.done:
                        break
                valid = bool(step.info["multi_turn_valid"])
                records[category].append(
                    {"id": entry["id"], "outputs": [], "turn_outputs": env.responses, "valid": valid}
                )
        entries = [e for c, n in MULTI.items() for e, _ in load_category(c, n)]
        _bfcl_generate(entries, texts, tmp_path / form / "bfcl" / "result")
        failed = _bfcl_evaluate(tmp_path / form / "bfcl" / "result", tmp_path / form / "bfcl" / "score", list(MULTI))
        write_run_files(tmp_path / form / "ours", records, model="m", bfcl_model=MODEL)
        for category in MULTI:
            theirs_files = _results(tmp_path / form / "bfcl" / "result", category)
            ours_files = _results(tmp_path / form / "ours" / "result", category)
            for record in records[category]:
                official = record["id"] not in failed[category]
                cases += 1
                agree += official == record["valid"]
                same_file += theirs_files[record["id"]] == ours_files[record["id"]]
                accepted[form] = accepted.get(form, 0) + official
                if official != record["valid"]:
                    disagreements.append((form, record["id"], official, record["valid"]))
    assert cases == len(MT_FORMS) * sum(MULTI.values()) == 55, cases
    assert agree == cases, f"{len(disagreements)} of {cases} verdicts differ from BFCL's: {disagreements}"
    assert same_file == cases, f"{cases - same_file} of {cases} stored responses differ from BFCL's result files"
    assert accepted["good"] >= 3, accepted  # the ground truth, well formed, passes BFCL's multi-turn checker
    assert accepted["missing_arguments"] == accepted["broken_json"] == 0, accepted  # no call decodes: state differs
    print(f"\n{cases} multi-turn cases ({len(MT_FORMS)} forms x {sum(MULTI.values())} entries): all equal to BFCL's;"
          f" accepted per form: {accepted}")  # fmt: skip
