"""The one door for datagen roles (`role_registry`): a new filter role or a new implementation of a stage is a
registration, chosen in the config and checked at resolve time; the judge comes through the same door."""

from __future__ import annotations

import json

import pytest

from palaestra.datagen.role_registry import (
    ROLES,
    FilterVerdict,
    RoleSpec,
    add_implementation,
    register_role,
    role_names,
)
from palaestra.datagen.roles import DeterministicQueryWriter, Query
from palaestra.shared.config import ConfigError, TrackingConfig, check_fields


class OneTurnOnly:
    """A filter: keeps samples of one user turn (a stand-in for a new role's file)."""

    name = "strict"
    role = "one_turn_only"

    def check(self, row: dict) -> FilterVerdict:
        turns = len(row["turns"])
        return FilterVerdict("one_turn_only:long" if turns > 1 else None, {"turns_seen": turns})


def one_turn_only(ctx) -> OneTurnOnly:
    return OneTurnOnly()


class PoliteWriter(DeterministicQueryWriter):
    name = "polite"

    def write(self, *args, **kwargs) -> Query | None:
        query = super().write(*args, **kwargs)
        return Query(query.text + " Thank you!", query.omitted) if query else None


def polite(ctx) -> PoliteWriter:
    return PoliteWriter()


@pytest.fixture(scope="module", autouse=True)
def registered():
    if "one_turn_only" not in ROLES:
        register_role(RoleSpec("one_turn_only", "filter", {"strict": f"{__name__}:one_turn_only"}, "off"))
    add_implementation("query_writer", "polite", f"{__name__}:polite")
    yield
    ROLES.unregister("one_turn_only")
    ROLES.get("query_writer").implementations.pop("polite", None)


def _run(tmp_path, name, **roles):
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import RolesConfig
    from palaestra.shared.tracking import Tracker

    cfg = DataGenerationConfig(
        name=name,
        num_samples=16,
        workers=0,
        output_dir=str(tmp_path),
        seed=3,
        roles=RolesConfig(**roles),
        tracking=TrackingConfig(enabled=False),
    )
    check_fields(cfg)
    generate(cfg, Tracker(cfg.tracking))
    rows = [json.loads(line) for line in cfg.output_path.read_text().splitlines()]
    return rows, json.loads((cfg.output_path.parent / "stats.json").read_text())


def test_the_builtin_roles_and_the_judge_are_registered_alike():
    assert role_names("stage") == ["tool_maker", "query_writer", "reasoner", "critic"]
    judge = ROLES.get("judge")
    assert judge.kind == "filter" and judge.default == "off" and set(judge.implementations) == {"llm"}


def test_a_new_filter_and_a_new_implementation_run_through_the_config(tmp_path):
    plain, _ = _run(tmp_path, "plain")
    rows, stats = _run(tmp_path, "filtered", others={"query_writer": "polite", "one_turn_only": "strict"})
    one_turn = [r for r in plain if len(r["turns"]) == 1]
    assert 0 < len(one_turn) < len(plain)  # the filter has something to drop and something to keep
    assert len(rows) == len(one_turn)  # same seeds, same samples: exactly the one-turn ones are kept
    assert stats["drops"]["one_turn_only:long"] == len(plain) - len(one_turn)
    for row in rows:
        assert row["provenance"]["roles"]["one_turn_only"] == "strict"
        assert row["provenance"]["roles"]["query_writer"] == "polite"
        assert row["verdict"]["turns_seen"] == 1
        assert all(t["query"].endswith("Thank you!") for t in row["turns"] if t["kind"] == "normal")


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ({"others": {"reasoner": "lmm"}}, "no implementation 'lmm'"),
        ({"others": {"judge": "on"}}, "no implementation 'on'"),
        ({"others": {"one_turn_onli": "strict"}}, "did you mean 'one_turn_only'"),
        ({"others": {"one_turn_only": "lenient"}}, "known: strict, off"),
    ],
)
def test_choices_are_refused_at_resolve_time(roles, message):
    from palaestra.datagen.generate import DataGenerationConfig
    from palaestra.datagen.pipeline import RolesConfig

    cfg = DataGenerationConfig(roles=RolesConfig(**roles), tracking=TrackingConfig(enabled=False))
    with pytest.raises(ConfigError, match=message):
        check_fields(cfg)


def test_a_stage_must_be_one_of_the_chain_slots():
    with pytest.raises(ValueError, match="a stage must be one of"):
        RoleSpec("paraphraser", "stage", {"x": "m:f"}, "x")
    with pytest.raises(ValueError, match="default 'y' is not an implementation"):
        RoleSpec("critic", "stage", {"x": "m:f"}, "y")
