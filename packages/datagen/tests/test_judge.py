"""The judge's prompt and the parsing of its answer (the filter end to end: test_llm_path.py)."""

from __future__ import annotations

import pytest

from palaestra.datagen.judge import judge_messages, parse_score, render_turns


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ('<think>Both values are stated.</think>{"score": 8, "reason": "clear"}', 8.0),
        ('```json\n{"score": "6", "reason": "one guess"}\n```', 6.0),
        ("Score: 3/10. The ticket id cannot be known.", 3.0),
        ('{"score": 11}', None),  # out of range
        ('{"score": "high"}', None),
        ("<think>score: 9</think>I cannot tell.", None),  # a score inside the reasoning is no answer
        ("lorem ipsum", None),
    ],
)
def test_parse_score(answer, score):
    assert parse_score(answer) == score


def test_the_prompt_shows_each_turn_and_what_answers_it():
    row = {
        "turns": [
            {"kind": "normal", "query": "Close ticket 7.", "ground_truth": ["close_ticket(ticket_id=7)"]},
            {"kind": "miss_param", "query": "Send it to my colleague.", "ground_truth": [], "missing": "receiver_id"},
            {"kind": "param_given", "query": "It's USR002.", "ground_truth": ["send_message(receiver_id='USR002')"]},
            {"kind": "miss_func", "query": "Log out.", "ground_truth": [], "missing": "logout"},
            {"kind": "func_added", "query": "", "ground_truth": ["logout()"], "missing": "logout"},
        ]
    }
    text = render_turns(row)
    lines = text.splitlines()
    assert lines[0] == "Turn 1 (user): Close ticket 7." and lines[1] == "  calls: close_ticket(ticket_id=7)"
    assert lines[3] == "  right answer: ask the user for the receiver_id (no call)"
    assert lines[4].startswith("Turn 3 (the user answers the assistant's question): It's USR002.")
    assert lines[7] == "  right answer: say that no available function can do it (no call)"
    assert lines[8] == "Turn 5: (a function becomes available: logout)" and lines[9] == "  calls: logout()"
    (message,) = judge_messages(row)
    assert message["role"] == "user" and text in message["content"] and '{"score": <1-10>' in message["content"]
