"""What the data teaches (`quality`) and the verifier's stricter grounding, on rows written by hand here.

Hand-built MathAPI rows with known answers: a value said once for ``add`` and
used again by ``subtract`` is borrowed; a sum the user repeats although the
assistant never told it is leaked (and is not, once the assistant's answer
reports it); a result carried into the next call without being said is a flow.
Then the deterministic run (the shared fixture) is held to the figures the
old generator failed.
"""

from __future__ import annotations

import json

from palaestra.datagen.envs import get_env
from palaestra.datagen.grounding import stated, verify_row
from palaestra.datagen.hardness import hardness_figures
from palaestra.datagen.quality import frame, quality_figures, sentence_frames, third_person_verbs, ungrammatical


def _row(turns: list[tuple[str, list[tuple[str, dict, object]], str]], env: str = "MathAPI") -> dict:
    """A row from (query, [(tool, arguments, output)], closing answer) per turn."""
    messages, gt_turns, traces = [], [], []
    n = 0
    for query, calls, answer in turns:
        messages.append({"role": "user", "content": query, "tool_calls": None})
        for name, args, output in calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": "<think>Next.</think>",
                    "tool_calls": [
                        {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    ],
                }
            )
            messages.append({"role": "tool", "content": json.dumps(output), "tool_call_id": f"c{n}", "name": name})
            n += 1
        messages.append({"role": "assistant", "content": f"<think>Done.</think>\n{answer}", "tool_calls": None})
        gt = [f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args, _ in calls]
        gt_turns.append({"kind": "normal", "query": query, "ground_truth": gt, "hidden_steps": 0})
        traces.append(
            {
                "target": calls[-1][0],
                "target_hit": True,
                "steps": [{"name": c, "arguments": a, "output": o, "feeds": {}} for c, a, o in calls],
            }
        )
    spec = get_env(env)
    return {
        "id": "hand",
        "messages": messages,
        "tools": json.dumps([{"type": "function", "function": d} for d in spec.docs]),
        "turns": gt_turns,
        "ground_truth": [t["ground_truth"] for t in gt_turns],
        "missed_function": [],
        "initial_config": json.dumps({env: {}}),
        "provenance": {"env": env, "trace": json.dumps(traces)},
    }


BORROWED = [
    (
        "Please add 100.5 and 8.0, then subtract it from 250.0.",
        [("add", {"a": 100.5, "b": 8.0}, {"result": 108.5}), ("subtract", {"a": 250.0, "b": 8.0}, {"result": 242.0})],
        "Done: add, subtract",
    )
]


def test_a_value_said_for_one_step_is_borrowed_by_another():
    q = quality_figures([_row(BORROWED)])
    assert q["borrowed_values"] == 1 and q["leaked_values"] == 0
    assert "borrowed_value" in verify_row(_row(BORROWED), get_env("MathAPI"))
    fixed = [("Please add 100.5 and 8.0, then subtract 8.0 from 250.0.", *BORROWED[0][1:])]
    assert quality_figures([_row(fixed)])["borrowed_values"] == 0
    assert verify_row(_row(fixed), get_env("MathAPI")) == []


def test_a_value_only_a_tool_returned_is_leaked_unless_the_answer_told_it():
    first = ("Please add 100.5 and 8.25.", [("add", {"a": 100.5, "b": 8.25}, {"result": 108.75})])
    second = ("Now multiply 108.75 by 3.0.", [("multiply", {"a": 108.75, "b": 3.0}, {"result": 326.25})], "Done.")
    silent = _row([(*first, "Done: add"), second])
    told = _row([(*first, "The sum is 108.75."), second])
    assert quality_figures([silent])["leaked_values"] == 1
    assert "leaked_value" in verify_row(silent, get_env("MathAPI"))
    assert quality_figures([told])["leaked_values"] == 0
    assert "leaked_value" not in verify_row(told, get_env("MathAPI"))
    # a value said only in an earlier turn does not ground this one
    again_calls = [("multiply", {"a": 108.75, "b": 8.25}, {"result": 897.1875})]
    again = _row(
        [(*first, "The sum is 108.75."), ("Now multiply it by the second number again.", again_calls, "Done.")]
    )
    assert "borrowed_value" in verify_row(again, get_env("MathAPI")) or "ungrounded_argument" in verify_row(
        again, get_env("MathAPI")
    )


def test_flow_and_closing_replies():
    carried = _row(
        [
            (
                "Add 100.5 and 8.25, then take the square root of the sum.",
                [("add", {"a": 100.5, "b": 8.25}, {"result": 108.75}), ("square_root", {"number": 108.75}, 10.43)],
                "The square root of the sum is 10.43.",
            )
        ]
    )
    q = quality_figures([carried, _row(BORROWED)])
    assert q["traces"] == 2 and q["traces_with_flow"] == 1
    assert q["closing_replies"] == 2 and q["closing_replies_reporting_results"] == 1
    assert q["closing_replies_naming_tools"] == 1  # "Done: add, subtract"


def test_frames_ignore_content_and_repetition():
    a = frame("Could you add 3 to 4, and then subtract 2, and then divide by 5?")
    b = frame("Could you book a flight to 'LAX', and then cancel the booking?")
    c = frame("Please book a flight to 'LAX'; after that, cancel the booking.")
    assert a == b != c
    assert sentence_frames("Could you open my file? Thanks a lot in advance!") == {"could you X my X ?", "thanks X !"}


def test_third_person_pastes_are_ungrammatical():
    verbs = third_person_verbs(get_env("VehicleControlAPI").docs)
    assert {"adjusts", "releases", "converts"} <= verbs
    assert ungrammatical("Could you adjusts the climate control of the vehicle?", verbs)
    assert not ungrammatical("Could you adjust the climate control of the vehicle?", verbs)


def test_common_words_ground_only_in_quotes():
    assert not stated("new", "Create a new file called notes", "file_name")
    assert stated("new", "Create a file called 'new'", "file_name")
    assert not stated("w", "Count the words in the file", "mode")
    assert stated("w", "Count the words (mode 'w')", "mode")
    assert stated("circuit_data.csv", "Open circuit_data.csv please", "file_name")


def test_deterministic_run_teaches_goals_in_words(deterministic_run):
    """The figures the old generator failed (measured on deterministic.yaml's output: README table)."""
    path, _ = deterministic_run
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    q = quality_figures(rows)
    assert q["ungrammatical_queries"] == 0  # old: 95 of 807
    assert q["leaked_values"] == 0  # old: 107
    assert q["borrowed_values"] <= 0.01 * q["steps"]  # old: 236 in 3,152 steps
    assert q["steps_after_target"] == 0  # old: 56% of the steps
    # old: 0.13 at 400 items; 0.14 here since goal coherence (issue 39); over the sequential traces since parallel
    # turns (one message of independent calls, no flow between them by design: `hardness`)
    parallel = hardness_figures(rows)["parallel_messages"]
    assert q["traces_with_flow"] / (q["traces"] - parallel) >= 0.10  # carried values instead (test_flow)
    assert q["traces_with_cross_turn_flow"] >= 0.07 * q["traces"]  # before issue 39's carry: 12 of 765 (1.6%)
    assert q["raw_parameter_names"] == 0
    assert q["closing_replies_reporting_results"] >= 0.6 * q["closing_replies"]  # old: 0
    assert q["closing_replies_naming_tools"] <= 0.1 * q["closing_replies"]  # old: all 807
    assert not any(
        (m["content"] or "").split("</think>")[-1].strip().startswith("Done:") for r in rows for m in r["messages"]
    )
    assert q["think_skeletons"] >= 60 and q["closing_reply_frames"] >= 60  # old: 24 and 2 over 400 samples
