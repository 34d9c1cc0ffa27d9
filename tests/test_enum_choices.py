"""Every fixed choice of every job's config is an enum field that ``palaestra run X --dry-run`` refuses with one
line (issue 24): the cases are found by walking each registered job's config class (nested sections, optional
sections, lists of enums), so a choice added later is covered without a new test line. A bad value exits 2 with
``palaestra: error: ... invalid value for '<key>' ...; did you mean '<nearest>'?`` before anything loads."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import pytest
import yaml

from palaestra.shared import cli
from palaestra.shared.jobs import JOBS


def _enum(tp: Any) -> type[enum.Enum] | None:
    return tp if isinstance(tp, type) and issubclass(tp, enum.Enum) else None


def _optional(tp: Any) -> Any:
    """``X | None`` -> X (else `tp` itself)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


Field = tuple[str, type[enum.Enum], bool, bool]


def enum_fields(schema: type, value: Any, prefix: str = "", unset: bool = False) -> typing.Iterator[Field]:
    """``(dotted key, enum, is a list, under an unset section)`` of every enum field under `schema`; list elements
    through `value`'s. An optional section that is None by default (``workers.llm``) cannot take a ``key=value``
    override of one of its fields: those cases go in the config file."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        tp, key, current = _optional(hints[f.name]), prefix + f.name, getattr(value, f.name, None)
        args = typing.get_args(tp)
        if _enum(tp):
            yield key, tp, False, unset
        elif typing.get_origin(tp) is list and args and _enum(args[0]):
            yield key, args[0], True, unset
        elif dataclasses.is_dataclass(tp):
            section = current if dataclasses.is_dataclass(current) else tp()
            yield from enum_fields(tp, section, key + ".", unset or current is None)
        elif typing.get_origin(tp) is list and args and dataclasses.is_dataclass(args[0]):
            for i, item in enumerate(current or []):
                yield from enum_fields(args[0], item, f"{key}.{i}.", unset)


def cases() -> list[tuple[str, str, type[enum.Enum], bool, bool]]:
    from palaestra.shared.jobs import load_config

    out = []
    for name in JOBS.names():
        cfg = load_config({"job": name})
        out += [(name, *field) for field in enum_fields(JOBS.get(name).config, cfg)]
    return out


CASES = cases()


def test_the_walk_finds_the_choices_of_every_kind_of_job():
    """Against a hand list: the walk reaches nested (``learner.strategy``), list (``mars.eval`` ``seats``) and
    package choices, so a broken walk cannot pass by finding nothing."""
    found = {(name, key) for name, key, *_ in CASES}
    expected = {
        ("rl.train", "learner.strategy"),
        ("rl.train", "learner.compute_dtype"),
        ("rl.train", "loss.reduction"),
        ("rl.train", "llm.dtype"),
        ("rl.train", "workers.llm.dtype"),
        ("mars.eval", "seats"),
        ("mars.train", "batch.rule"),
        ("aed.attack", "preference.judge"),
        ("datagen.generate", "roles.critic"),
        ("egpo.eval", "decoder"),
    }
    assert expected <= found, expected - found


@pytest.mark.parametrize(("job", "key", "choice", "many", "unset"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_a_bad_choice_is_a_one_line_dry_run_error(tmp_path, capsys, job, key, choice, many, unset):
    good = next(iter(choice)).value
    bad = good + "x"  # one letter off: the error must point back at `good`
    data: dict[str, Any] = {"job": job}
    overrides = [f"{key}=[{bad}]" if many else f"{key}={bad}"]
    if unset:  # the section goes in the file, with the bad value
        *sections, last = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[last], overrides = ([bad] if many else bad), []
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["run", str(path), "--dry-run", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("palaestra: error: ") and "\n" not in err, err
    assert f"'{key}" in err and f"did you mean '{good}'?" in err, err
