"""The seeds x arms matrix (palaestra.shared.matrix): combinations and named arms, parallel on Ray, resumable,
nested MLflow runs, and the table's Student t intervals against SciPy."""

import json
import math
from pathlib import Path

import pytest
import yaml

from palaestra.shared import cli
from palaestra.shared.config import ConfigError
from palaestra.shared.matrix import (
    MatrixConfig,
    combinations,
    matrix_table,
    parse_axes,
    run_config,
    split_matrix,
)

PROBE = "palaestra.shared.testing:PROBE_JOB"


def probe_config(tmp_path: Path, tracking, **extra) -> Path:
    data = {
        "job": PROBE,
        "output_dir": str(tmp_path / "out"),
        "tracking": {"experiment": "m", "uri": tracking.uri, "artifact_root": tracking.artifact_root},
        "matrix": {"arms": {"arm": {"a": {"offset": 10.0}, "b": {"offset": 20.0, "scale": 2.0}}}},
        **extra,
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_parse_axes_reads_yaml_scalars():
    assert parse_axes(["seed=0,1,2", "arm=a,b", "loss.dual_clip=1.4"]) == {
        "seed": [0, 1, 2],
        "arm": ["a", "b"],
        "loss.dual_clip": [1.4],
    }
    with pytest.raises(ConfigError, match="not of the form axis=value1,value2"):
        parse_axes(["seed"])


def test_combinations_merge_named_arms_and_set_plain_values(tmp_path, tracking):
    data = yaml.safe_load(probe_config(tmp_path, tracking).read_text())
    data, matrix = split_matrix(data, ["seed=0,1", "arm=a,b", "sleep_s=0.5"])
    base, combos = combinations(data, matrix)
    assert [c.values for c in combos][:2] == [
        {"seed": 0, "arm": "a", "sleep_s": 0.5},
        {"seed": 0, "arm": "b", "sleep_s": 0.5},
    ]
    by_label = {c.label: c.cfg for c in combos}
    b1 = by_label["seed=1 arm=b sleep_s=0.5"]
    assert (b1.seed, b1.offset, b1.scale, b1.sleep_s) == (1, 20.0, 2.0, 0.5)
    assert by_label["seed=0 arm=a sleep_s=0.5"].scale == 1.0  # an arm's fragment does not leak into another
    assert {Path(c.cfg.output_dir).parent for c in combos} == {Path(base.output_dir)}
    assert len({c.cfg.output_dir for c in combos}) == 4


def test_a_bad_arm_fails_before_anything_runs(tmp_path, tracking):
    path = probe_config(tmp_path, tracking, matrix={"arms": {"arm": {"bad": {"ofset": 1}}}})
    with pytest.raises(ConfigError, match=r"matrix seed=0 arm=bad: unknown key 'ofset'; did you mean 'offset'"):
        run_config(path, axes=["seed=0", "arm=bad"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"matrix: unknown key 'axis'; did you mean 'axes'"):
        split_matrix({"job": PROBE, "matrix": {"axis": {"seed": [0]}}})
    with pytest.raises(ConfigError, match="matrix.arms.arm: no such axis"):
        split_matrix({"job": PROBE, "matrix": {"arms": {"arm": {"a": {}}}}}, ["seed=0"])


def test_table_intervals_are_student_t():
    from scipy import stats

    records = []
    values = {"a": [0.31, 0.44, 0.29, 0.52], "b": [0.12, 0.18]}
    for arm, scores in values.items():
        for seed, score in enumerate(scores):
            records.append({"values": {"seed": seed, "arm": arm}, "summary": {"score": score}})
    records.append({"values": {"seed": 2, "arm": "b"}, "error": "RuntimeError: boom"})
    text, rows = matrix_table(records, MatrixConfig(), "score")
    for row, (arm, scores) in zip(rows, values.items(), strict=True):
        n, mean = len(scores), sum(scores) / len(scores)
        sd = math.sqrt(sum((x - mean) ** 2 for x in scores) / (n - 1))
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)  # the closed form, SciPy's quantile
        assert row["arm"] == f"arm={arm}" and row["n"] == n
        assert row["mean"] == pytest.approx(mean, abs=1e-12)
        assert row["interval"] == pytest.approx((mean - half, mean + half), abs=1e-9)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["arm", "n", "score", "mean"]
    assert "0: 0.31, 1: 0.44, 2: 0.29, 3: 0.52" in lines[1]
    assert "2: failed (RuntimeError: boom)" in lines[2]


def test_one_seed_gives_no_interval():
    text, rows = matrix_table([{"values": {"seed": 0}, "summary": {"score": 1.5}}], MatrixConfig(), "score")
    assert rows[0]["interval"] is None and rows[0]["mean"] == 1.5
    assert text.splitlines()[1].split()[:4] == ["(all)", "1", "1.5", "-"]


def test_dry_run_lists_the_combinations(tmp_path, tracking, capsys):
    path = probe_config(tmp_path, tracking)
    assert cli.main(["run", str(path), "--dry-run", "sleep_s=0", "--matrix", "seed=0,1", "arm=a,b"]) == 0
    out = capsys.readouterr().out
    assert out.count("(to run)") == 4 and "# 4 combination(s); table metric: score" in out
    assert not (tmp_path / "out").exists()


def test_sequential_matrix_nests_runs_and_resumes(tmp_path, tracking, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = probe_config(tmp_path, tracking)
    data = yaml.safe_load(path.read_text())
    data["matrix"]["parallel"] = False
    path.write_text(yaml.safe_dump(data))
    args = ["run", str(path), "--matrix", "seed=0,1", "arm=a"]
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert "arm=a  2  10.5" in first
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.uri)
    runs = client.search_runs([client.get_experiment_by_name("m").experiment_id])
    parent = next(r for r in runs if r.info.run_name.startswith("matrix "))
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == ["seed=0 arm=a", "seed=1 arm=a"]
    record = json.loads((tmp_path / "out" / "seed-1_arm-a" / "matrix_result.json").read_text())
    assert record["summary"]["score"] == 11.0 and record["metrics"]["result/score"] == 11.0  # the run's metrics too
    text, _ = matrix_table([record], MatrixConfig(), "result/score")  # a metric of the run, not of the summary
    assert text.splitlines()[1].split()[:3] == ["arm=a", "1", "11"]
    assert cli.main(args) == 0  # again: nothing runs, the same table
    second = capsys.readouterr().out
    assert second.count("finished before") == 2 and "arm=a  2  10.5" in second
    for seed in (0, 1):
        assert len((tmp_path / "out" / f"seed-{seed}_arm-a" / "runs.jsonl").read_text().splitlines()) == 1
    # a changed config is not the finished one: it runs again (overrides go before --matrix; after it, an axis)
    assert cli.main(["run", str(path), "scale=3", "--matrix", "seed=0,1", "arm=a"]) == 0
    third = capsys.readouterr().out
    assert "0: 10, 1: 13" in third
    assert len((tmp_path / "out" / "seed-1_arm-a" / "runs.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_combinations_run_at_once_on_ray_and_resume(ray_local, tmp_path, tracking, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = probe_config(tmp_path, tracking, rendezvous_dir=str(tmp_path / "meet"), rendezvous_n=2)
    args = ["run", str(path), "--matrix", "seed=0", "arm=a,b"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "on Ray" in out
    spans = []
    for arm in ("a", "b"):
        (line,) = (tmp_path / "out" / f"seed-0_arm-{arm}" / "runs.jsonl").read_text().splitlines()
        spans.append(json.loads(line))
    assert spans[0]["pid"] != spans[1]["pid"]  # two worker processes ...
    assert max(s["start"] for s in spans) < min(s["end"] for s in spans)  # ... each waited for the other to start
    record = json.loads((tmp_path / "out" / "seed-0_arm-b" / "matrix_result.json").read_text())
    assert record["summary"]["score"] == 20.0
    assert cli.main(args) == 0  # a second invocation re-runs nothing
    assert capsys.readouterr().out.count("finished before") == 2
    for arm in ("a", "b"):
        assert len((tmp_path / "out" / f"seed-0_arm-{arm}" / "runs.jsonl").read_text().splitlines()) == 1
