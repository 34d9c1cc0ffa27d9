"""Own initial states for all eight environments; the contamination check finds BFCL's test data and only that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from palaestra.datagen.contamination import ContaminationIndex
from palaestra.datagen.envs import BFCL_CLASSES, ToolEnv, get_env
from palaestra.datagen.initial_states import generate_state
from palaestra.shared.bfcl_data import word_ngrams


def _bfcl_multi_turn_entries():
    import bfcl_eval

    data = Path(bfcl_eval.__file__).parent / "data"
    with open(data / "BFCL_v4_multi_turn_base.json") as f:
        return [json.loads(line) for line in f]


def test_states_are_seeded_varied_and_load():
    for env in BFCL_CLASSES:
        a, b = generate_state(env, 1), generate_state(env, 1)
        assert a == b, env  # seeded
        if env != "MathAPI":  # MathAPI has no state
            assert len({json.dumps(generate_state(env, s), sort_keys=True) for s in range(20)}) >= 15, env
        inst = ToolEnv(get_env(env), generate_state(env, 3))
        assert inst.healthy()


def test_states_use_the_keys_bfcl_configs_use():
    """Every key of a drawn config is one that BFCL's own configs use for that class (same shape, other values)."""
    known: dict[str, set] = {}
    for entry in _bfcl_multi_turn_entries():
        for cls, config in entry["initial_config"].items():
            known.setdefault(cls, set()).update(config)
    for env in BFCL_CLASSES:
        drawn = set(generate_state(env, 5))
        extra = drawn - known.get(env, set())
        assert not extra or env == "TravelAPI" and extra <= {"credit_card_list"}, (env, extra)


def test_no_drawn_state_equals_a_bfcl_test_config():
    index = ContaminationIndex.from_bfcl()
    bfcl: dict[str, set] = {cls: set() for cls in BFCL_CLASSES}
    for entry in _bfcl_multi_turn_entries():
        for cls, cfg in entry["initial_config"].items():
            bfcl[cls].add(json.dumps(cfg, sort_keys=True))
    for env in BFCL_CLASSES:
        for seed in range(200):
            cfg = generate_state(env, seed)
            assert index.config_hits({env: cfg}) == []
            if cfg:
                assert json.dumps(json.loads(json.dumps(cfg)), sort_keys=True) not in bfcl[env]


def test_contamination_check_catches_bfcl_configs_and_queries():
    index = ContaminationIndex.from_bfcl()
    entry = next(e for e in _bfcl_multi_turn_entries() if "TicketAPI" in e["initial_config"])
    query = entry["question"][0][0]["content"]
    assert len(query.split()) >= 8
    row = {
        "initial_config": json.dumps({"TicketAPI": entry["initial_config"]["TicketAPI"]}),
        "messages": [{"role": "user", "content": "Hello. " + query}],
    }
    assert index.check(row) == ["config:TicketAPI", "query_ngram"]
    clean = {
        "initial_config": json.dumps({"TicketAPI": generate_state("TicketAPI", 0)}),
        "messages": [{"role": "user", "content": "Please close ticket 4102 and tell me what it was about."}],
    }
    assert index.check(clean) == []
    # an empty config (a stateless environment) is not evidence of anything
    assert index.config_hits({"MathAPI": {}}) == []
    summary = index.summary([row, clean])
    assert summary == {
        "checked": 2,
        "contaminated": 1,
        "config_identical": 1,
        "query_ngram_overlap": 1,
        "ngram": 8,
    }


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [("A b, c!", 2, {("a", "b"), ("b", "c")}), ("one two", 3, set())],
)
def test_word_ngrams(text, n, expected):
    assert word_ngrams(text, n) == expected
