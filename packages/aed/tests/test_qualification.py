"""Victim qualification: the verdict from counts against Wilson's closed form, the one-line refusals of an attack
on an unqualified victim, and a short qualification run that writes the record the attack reads."""

from __future__ import annotations

import json
import math

import pytest

from palaestra.aed.qualify import QualifyConfig, check_qualified, qualify, record_path, traffic, verdict
from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config, run_job

Z = 1.959963984540054


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p = k / n
    root = Z * math.sqrt(Z * Z + 4 * n * p * (1 - p))
    return (2 * n * p + Z * Z - root) / (2 * (n + Z * Z)), (2 * n * p + Z * Z + root) / (2 * (n + Z * Z))


def test_verdict_passes_only_at_five_percent_or_less():
    ok = verdict(5, 2, 100, 0.05)
    assert ok["passed"] and ok["accident_rate"] == 0.05 and ok["victim_fault_share"] == 0.4
    assert ok["accident_rate_ci"] == pytest.approx(wilson_by_hand(5, 100))
    assert ok["victim_fault_share_ci"] == pytest.approx(wilson_by_hand(2, 5))
    assert not verdict(6, 6, 100, 0.05)["passed"]  # the control: one accident more fails
    assert verdict(0, 0, 100, 0.05)["accident_rate_ci"][0] == 0.0


def test_qualify_config_refuses_too_few_episodes_or_a_lax_bar():
    with pytest.raises(ConfigError, match="must be at least 100"):
        load_config({"job": "aed.qualify", "episodes": 50})
    with pytest.raises(ConfigError, match=r"must be in \[0, 0.05\]"):
        load_config({"job": "aed.qualify", "max_accident_rate": 0.2})


def attack_cfg(tmp_path, **extra):
    base = {"job": "aed.attack", "tracking": {"enabled": False}, "output_dir": str(tmp_path), "video": False}
    return load_config({**base, "env_overrides": {"vehicles_count": 6}, **extra})


def write_record(cfg, passed: bool = True, **changes):
    path = record_path(cfg, "highway")
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**verdict(2 if passed else 30, 1, 100, 0.05), "traffic": {**traffic(cfg), **changes}}
    path.write_text(json.dumps(record))


def one_line_error(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        run_job(cfg)  # refused before any task runs
    assert "\n" not in str(err.value)
    return str(err.value)


def test_attacks_refuse_an_unqualified_victim(tmp_path):
    cfg = attack_cfg(tmp_path)
    assert "victim idm on highway is not qualified (no record" in one_line_error(cfg)
    write_record(cfg, passed=False)
    assert "failed qualification: accident rate alone 0.300 > 0.05" in one_line_error(cfg)
    write_record(cfg, env_overrides={"vehicles_count": 20})
    assert "was qualified in other traffic" in one_line_error(cfg)
    write_record(cfg)
    check_qualified(cfg)  # a passing record for this traffic: no error


def test_an_rl_victims_record_lives_beside_its_checkpoint(tmp_path):
    cfg = attack_cfg(tmp_path, victim="rl", victim_checkpoint=str(tmp_path / "{scenario}_dqn.zip"))
    assert record_path(cfg, "merge") == tmp_path / "merge_dqn.zip.qualification.json"


def test_a_short_qualification_writes_what_the_attack_reads(tmp_path):
    """A few short episodes (the job itself asks for at least 100): the record's counts are those of the
    passive evaluation, and the attack in the same traffic accepts it."""
    cfg = QualifyConfig(output_dir=str(tmp_path), env_overrides={"vehicles_count": 6}, max_steps=3, episodes=3)
    record = qualify(cfg, "highway")
    assert record["episodes"] == 3 and record["accidents"] == sum(record["types"].values())
    assert record["passed"] == (record["accidents"] / 3 <= 0.05)
    path = record_path(cfg, "highway")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**record, "passed": True}))
    check_qualified(attack_cfg(tmp_path, max_steps=3))
