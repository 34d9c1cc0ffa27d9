"""Issue 39's harder data, re-checked from the exported files: parallel calls, carried values, user words.

Every figure here is recounted from ``export/openai.jsonl`` by this file's own code (not `hardness`, not
the generator's records) and the samples are replayed on fresh instances of BFCL's own classes
(`bfcl_eval`), with negative controls: a broken carried value and dependent "parallel" calls are caught.
"""

from __future__ import annotations

import copy
import importlib
import json
import re

import pytest

from palaestra.shared.config import TrackingConfig


@pytest.fixture(scope="module")
def exported(deterministic_run):
    from palaestra.datagen.export import ExportConfig, export
    from palaestra.shared.tracking import Tracker

    path, _ = deterministic_run
    cfg = ExportConfig(input=str(path), tracking=TrackingConfig(enabled=False))
    export(cfg, Tracker(cfg.tracking))
    records = [json.loads(line) for line in (path.parent / "export" / "openai.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    stats = json.loads((path.parent / "stats.json").read_text())
    return records, rows, stats


def _fresh(cls_name: str, config: dict):
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    inst = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)()
    if hasattr(inst, "_load_scenario"):
        inst._load_scenario(copy.deepcopy(config.get(cls_name, {})), long_context=False)
    return inst


def _run(inst, name: str, args: dict):
    try:
        return json.loads(json.dumps(getattr(inst, name)(**args), default=str))
    except Exception as e:  # BFCL's executor turns an exception into the error text
        return {"error": str(e)}


def _start(cls_name: str, config: dict, done: list[tuple[str, dict]]):
    """A fresh BFCL instance after the conversation's calls so far."""
    inst = _fresh(cls_name, config)
    for name, args in done:
        _run(inst, name, args)
    return inst


def _bfcl_class(row: dict) -> str:
    (cls_name,) = row["involved_classes"]
    return cls_name


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def _values(x) -> list:
    if isinstance(x, dict):
        return [y for v in x.values() for y in _values(v)]
    if isinstance(x, list):
        return [y for v in x for y in _values(v)]
    return [x]


def test_parallel_calls_replay_in_order_on_fresh_bfcl_instances_and_are_independent(exported):
    """Each parallel message's calls, executed in BFCL's own class after the conversation before it, return the
    tool messages that follow it, in order; each call alone returns the same, and so does the reverse order."""
    records, rows, _ = exported
    by_id = {r["id"]: r for r in rows}
    parallel = 0
    for rec in records:
        row = by_id[rec["id"]]
        config = json.loads(row["initial_config"])
        cls_name = _bfcl_class(row)
        done: list[tuple[str, dict]] = []  # the calls before this message, to rebuild its start state
        msgs = rec["messages"]
        for i, m in enumerate(msgs):
            calls = _calls(m)
            if len(calls) >= 2:
                parallel += 1
                results = [json.loads(x["content"]) for x in msgs[i + 1 : i + 1 + len(calls)]]
                assert all(x["role"] == "tool" for x in msgs[i + 1 : i + 1 + len(calls)])

                batch = _start(cls_name, config, done)
                assert [_run(batch, n, a) for n, a in calls] == results, rec["id"]
                for (n, a), result in zip(calls, results):
                    assert _run(_start(cls_name, config, done), n, a) == result, (rec["id"], n)
                back = _start(cls_name, config, done)
                assert [_run(back, n, a) for n, a in reversed(calls)][::-1] == results, rec["id"]
            done += calls
    assert parallel >= 5, parallel


def _dependent_turns(rec: dict) -> list[bool]:
    """Per user turn: does a call take a value an earlier turn's tool message returned that no user message so far
    says (an id, a name, a figure; a small integer only for an id parameter)?"""
    turns: list[dict] = []
    for m in rec["messages"]:
        if m["role"] == "user":
            turns.append({"said": m["content"], "calls": [], "returned": []})
        elif turns and m["role"] == "assistant":
            turns[-1]["calls"] += _calls(m)
        elif turns and m["role"] == "tool":
            turns[-1]["returned"] += _values(json.loads(m["content"]))
    out = []
    said = ""
    for t, turn in enumerate(turns):
        said += "\n" + turn["said"]
        earlier = [v for x in turns[:t] for v in x["returned"]]
        dep = False
        for _, args in turn["calls"]:
            for param, value in args.items():
                for v in _values(value):
                    if isinstance(v, bool) or v is None or v not in earlier:
                        continue
                    if isinstance(v, str):
                        carried = len(v) >= 4 and v.lower() not in said.lower()
                    else:
                        big = abs(v) >= 100 or (isinstance(v, float) and not v.is_integer()) or "id" in param.lower()
                        carried = big and not re.search(rf"(?<![\d.]){re.escape(str(v))}(?![\d])", said)
                    dep = dep or carried
        out.append(dep)
    return out


def test_counts_recounted_from_the_export_match_stats(exported):
    """stats.json -> hardness against this file's recount of openai.jsonl: parallel messages and calls per
    turn exactly; dependent later turns within 5% (the two definitions of 'said' differ at the edges)."""
    records, _, stats = exported
    h = stats["hardness"]
    parallel = sum(len(_calls(m)) >= 2 for r in records for m in r["messages"])
    assert parallel == h["parallel_messages"] > 0
    per_turn = []
    for r in records:
        for m in r["messages"]:
            if m["role"] == "user":
                per_turn.append(0)
            elif per_turn and m["role"] == "assistant":
                per_turn[-1] += len(_calls(m))
    with_calls = [k for k in per_turn if k]
    assert abs(sum(with_calls) / len(with_calls) - h["calls_per_turn"]) < 1e-9
    assert sum(k == 1 for k in with_calls) / len(with_calls) == pytest.approx(h["single_call_share"])
    later = [d for r in records for d in _dependent_turns(r)[1:]]
    assert len(later) == h["later_turns"]
    assert abs(sum(later) - h["dependent_later_turns"]) <= max(2, 0.05 * sum(later)), (sum(later), h)
    assert sum(later) >= 0.15 * len(later), (sum(later), len(later))  # before: 8% of later turns


def test_user_messages_do_not_paste_tool_descriptions(exported):
    """The requests are in a user's words: few user messages contain a tool's description sentence (before:
    97% of them did)."""
    from palaestra.datagen.envs import get_env

    records, _, stats = exported
    pasted = users = 0
    for r in records:
        docs = get_env(r["env"]).docs
        sentences = set()
        for d in docs:
            first = d["description"].split("Tool description:", 1)[-1].strip().split(". ")[0].rstrip(".").lower()
            sentences |= {first} if len(first.split()) >= 3 else set()
            if len(first.split()) >= 4:
                sentences.add(" ".join(first.split()[1:]))  # without its verb
        for m in r["messages"]:
            if m["role"] == "user":
                users += 1
                pasted += any(s in m["content"].lower() for s in sentences)
    assert pasted <= 0.05 * users, (pasted, users)
    assert stats["hardness"]["pasted_descriptions"] <= pasted  # the stats count is the stricter match


def _with_prior_feed(rows):
    for row in rows:
        for t, trace in enumerate(json.loads(row["provenance"]["trace"])):
            for i, s in enumerate(trace["steps"]):
                for param, _key in s.get("prior_feeds", {}).items():
                    if isinstance(s["arguments"][param], str | int) and not isinstance(s["arguments"][param], bool):
                        return row, t, i, param
    raise AssertionError("no carried value in the fixture")


def test_a_broken_carried_value_is_caught_by_replay(exported):
    """Negative control: change a value carried from an earlier turn, in the trace and in the export's call, and
    both checks catch it: `coherence.check_row` (broken_dependency) and the replay on BFCL's class (the call's
    result no longer matches, or the value is no earlier result)."""
    from palaestra.datagen.coherence import check_row
    from palaestra.datagen.envs import get_env

    _, rows, _ = exported
    row, t, i, param = _with_prior_feed(rows)
    spec = get_env(row["provenance"]["env"])
    assert "broken_dependency" not in check_row(row, spec)  # the control: as generated, it holds
    bad = copy.deepcopy(row)
    traces = json.loads(bad["provenance"]["trace"])
    value = traces[t]["steps"][i]["arguments"][param]
    traces[t]["steps"][i]["arguments"][param] = value + 7 if isinstance(value, int) else value + "_x"
    bad["provenance"]["trace"] = json.dumps(traces)
    assert "broken_dependency" in check_row(bad, spec)
    # the same break seen from the messages: the value is no longer one an earlier turn returned
    rec = {"messages": copy.deepcopy(row["messages"])}
    assert any(_dependent_turns(rec))
    for m in rec["messages"]:
        for c in m.get("tool_calls") or []:
            args = json.loads(c["function"]["arguments"])
            if args.get(param) == value:
                args[param] = traces[t]["steps"][i]["arguments"][param]
                c["function"]["arguments"] = json.dumps(args)
    assert sum(_dependent_turns(rec)) < sum(_dependent_turns({"messages": row["messages"]}))


def test_dependent_calls_are_not_parallel():
    """Negative control for `parallel.independent` (which the sampler and `coherence.check_row` use): making a
    folder and entering it depend on each other; two folders, or two sums, do not."""
    from palaestra.datagen.envs import ToolEnv, get_env
    from palaestra.datagen.parallel import independent

    fs = get_env("GorillaFileSystem")
    env = ToolEnv(fs, fs.initial_state(3))
    assert not independent(env, [("mkdir", {"dir_name": "zz_new"}), ("cd", {"folder": "zz_new"})])
    assert independent(env, [("mkdir", {"dir_name": "zz_a"}), ("mkdir", {"dir_name": "zz_b"})])
    math = get_env("MathAPI")
    menv = ToolEnv(math, math.initial_state(0))
    assert independent(menv, [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})])


def test_reasoning_follows_the_trace(exported):
    """The reasoning names, for a carried value, the call that returned it, and differs with the structure:
    many distinct sentences, no sentence in more than a fifth of the blocks."""
    records, _, stats = exported
    blocks = [
        b for r in records for m in r["messages"] for b in re.findall(r"<think>(.*?)</think>", m["content"], re.S)
    ]
    sentences = [s for b in blocks for s in re.split(r"(?<=[.!?])\s+", b.strip()) if s]
    top = max(sentences.count(s) for s in set(sentences))
    assert top <= 0.2 * len(blocks), top
    assert len(set(sentences)) == stats["hardness"]["distinct_reasoning_sentences"]
    carried = [b for b in blocks if "returned for" in b]
    assert carried and all(re.search(r"is the [\w ]+ \w+ returned for", b) for b in carried)
    # every quoted value in the reasoning is one the conversation holds, exactly (case kept: 'CRH', not 'crh')
    for r in records:
        said = json.dumps([m["content"] for m in r["messages"] if m["role"] in ("user", "tool")])
        said += json.dumps([c["function"]["arguments"] for m in r["messages"] for c in m.get("tool_calls") or []])
        for m in r["messages"]:
            for b in re.findall(r"<think>(.*?)</think>", m["content"], re.S):
                for value in re.findall(r"(?<![A-Za-z])'([^']{2,40})'(?![A-Za-z])", b):
                    assert value in said, (r["id"], value, b[:200])


def test_error_recovery_is_off_by_default_and_replays_when_on(exported, tmp_path):
    """Flagged error-recovery turns (`recovery`): none in the default run; with ``p_error_recovery`` 1, flagged
    turns whose first call fails (an error response BFCL's class also returns) and whose next calls are the
    ground truth, every sample still grounded and coherent by replay."""
    from palaestra.datagen.coherence import check_row
    from palaestra.datagen.envs import get_env, is_error_response
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.grounding import verify_row
    from palaestra.datagen.pipeline import ItemConfig
    from palaestra.shared.tracking import Tracker

    records, rows, stats = exported
    assert not any(t.get("error_recovery") for r in rows for t in r["turns"])
    assert stats["hardness"]["recovered_errors"] == 0
    cfg = DataGenerationConfig(
        num_samples=12, workers=0, envs=["GorillaFileSystem"], output_dir=str(tmp_path), seed=1,
        item=ItemConfig(p_error_recovery=1.0), tracking=TrackingConfig(enabled=False), log_samples=False,
    )  # fmt: skip
    generate(cfg, Tracker(cfg.tracking))
    made = [json.loads(line) for line in cfg.output_path.read_text().splitlines()]
    flagged = [r for r in made if any(t.get("error_recovery") for t in r["turns"])]
    assert flagged
    for row in flagged:
        spec = get_env(row["provenance"]["env"])
        assert verify_row(row, spec) == [] and check_row(row, spec) == []
        config = json.loads(row["initial_config"])
        inst = _fresh(_bfcl_class(row), config)
        msgs = row["messages"]
        errors = 0
        for i, m in enumerate(msgs):  # replay every call on BFCL's class: the same results, errors included
            for k, (name, args) in enumerate(_calls(m)):
                out = _run(inst, name, args)
                assert out == json.loads(msgs[i + 1 + k]["content"]), (row["id"], name)
                errors += is_error_response(out)
        assert errors >= 1
    assert json.loads((cfg.output_path.parent / "stats.json").read_text())["hardness"]["recovered_errors"] >= len(
        flagged
    )
