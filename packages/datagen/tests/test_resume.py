"""Append-only output survives a SIGKILL: the resumed run has no loss, no duplicate, no torn line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from palaestra.datagen.dataset import SampleWriter, dedup_key

SCRIPT = """
import sys
from palaestra.datagen.generate import DataGenerationConfig, generate
from palaestra.shared.config import TrackingConfig
from palaestra.shared.tracking import Tracker
cfg = DataGenerationConfig(num_samples=160, workers=0, items_per_task=4, output_dir=sys.argv[1], seed=3,
                     tracking=TrackingConfig(enabled=False), log_samples=False)
generate(cfg, Tracker(cfg.tracking))
"""


def _run(out_dir, kill_after_lines=None):
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(out_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if kill_after_lines is None:
        assert proc.wait(timeout=300) == 0
        return
    path = out_dir / "datagen" / "default" / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= kill_after_lines:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _lines(out_dir):
    raw = (out_dir / "datagen" / "default" / "samples.jsonl").read_text()
    assert raw.endswith("\n")
    return [json.loads(line) for line in raw.splitlines()]  # every line whole JSON


@pytest.mark.slow
def test_killed_run_resumes_without_loss_or_duplicates(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    _run(reference)
    _run(killed, kill_after_lines=40)
    partial = (killed / "datagen" / "default" / "samples.jsonl").read_text().count("\n")
    assert 40 <= partial < 150, "the kill must land mid-run"
    _run(killed)
    want, got = _lines(reference), _lines(killed)
    assert len({r["id"] for r in got}) == len(got)
    assert len({dedup_key(r) for r in got}) == len(got)
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in want)
    assert {r["id"]: r["ground_truth"] for r in got} == {r["id"]: r["ground_truth"] for r in want}


def test_torn_last_line_is_cut_on_open(tmp_path):
    path = tmp_path / "s.jsonl"
    row = {"id": "a", "turns": [{"query": "q", "ground_truth": []}], "ground_truth": [[]]}
    path.write_text(json.dumps(row) + "\n" + '{"id": "b", "tur')
    with SampleWriter(path) as writer:
        assert writer.done == {"a"}
        assert not writer.add("a2", dict(row, id="a2"))  # same query + trace: a duplicate
        assert writer.add("c", dict(row, id="c", turns=[{"query": "other", "ground_truth": []}]))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "c"]
