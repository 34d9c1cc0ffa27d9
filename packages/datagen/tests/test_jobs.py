"""The jobs end to end: datagen.generate on Ray workers into MLflow; datagen.mine steering toward failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from palaestra.shared.jobs import load_config, run_job


@pytest.mark.slow
def test_generate_job_on_ray_logs_stats_and_graph(ray_local, tracking, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = load_config(
        {
            "job": "datagen.generate",
            "num_samples": 24,
            "workers": 2,
            "items_per_task": 6,
            "output_dir": str(tmp_path),
            "envs": ["MathAPI", "TicketAPI", "VehicleControlAPI"],
        }
    )
    cfg.tracking = tracking
    result = run_job(cfg)
    assert result["kept"] >= 20
    kept, attempted = result["kept"], result["kept"] + result["dropped"]
    assert result["headline"].startswith(f"verified and kept {kept / attempted:.2f} [")
    assert f"({kept} of {attempted} items" in result["headline"]
    assert (Path(result["artifacts"]) / "samples.jsonl").is_file()
    client = MlflowClient(tracking.uri)
    run = client.get_run(result["run_id"])
    for key in (
        "stats/calls_per_trace",
        "stats/hidden_step_fraction",
        "stats/function_coverage",
        "stats/env_coverage",
        "stats/pass_rate_try_1",
        "stats/llm_calls_per_kept_sample",
    ):
        assert key in run.data.metrics, key
    artifacts = {a.path for a in client.list_artifacts(result["run_id"], "graph")}
    assert "graph/graph.json" in artifacts
    assert "figures/graph.png" in {a.path for a in client.list_artifacts(result["run_id"], "figures")}
    stats = json.loads(
        client.download_artifacts(result["run_id"], "stats.json", str(tmp_path))
        and (tmp_path / "stats.json").read_text()
    )
    assert stats["env_coverage"] == 1.0


@pytest.mark.slow
def test_mine_steers_sampling_toward_student_failures(tracking, tmp_path):
    from mlflow.tracking import MlflowClient

    weak = ["add", "multiply", "sum_values"]
    cfg = load_config(
        {
            "job": "datagen.mine",
            "rounds": 2,
            "num_samples": 40,
            "workers": 0,
            "student": "scripted",
            "weak_tools": weak,
            "envs": ["MathAPI"],
            "name": "mine",
            "output_dir": str(tmp_path),
        }
    )
    cfg.tracking = tracking
    result = run_job(cfg)
    client = MlflowClient(tracking.uri)
    share = client.get_metric_history(result["run_id"], "mine/weak_target_share")
    rate = client.get_metric_history(result["run_id"], "mine/student_failure_rate")
    assert len(share) == 2 and len(rate) == 2
    assert rate[0].value > 0
    # round 0 samples targets uniformly (3 of 17 tools); round 1 is steered toward the failing tools
    assert share[1].value > share[0].value + 0.2
    # independently of the job's own metric: targets of the weak tools in each round's dataset
    from palaestra.datagen.dataset import read_rows

    shares = []
    for k in range(2):
        rows = read_rows(tmp_path / "datagen" / "mine" / f"round_{k}" / "samples.jsonl")
        shares.append(sum(r["provenance"]["target"] in weak for r in rows) / len(rows))
    assert shares[1] > 2 * shares[0]
    weight_add = client.get_metric_history(result["run_id"], "weight/MathAPI.add")
    weight_other = client.get_metric_history(result["run_id"], "weight/MathAPI.logarithm")
    assert weight_add[0].value > weight_other[0].value


def test_bad_config_is_a_clear_error(tmp_path):
    from palaestra.shared.config import ConfigError
    from palaestra.shared.registry import UnknownNameError

    with pytest.raises(ConfigError, match="invalid value for 'roles.reasoner'"):  # an enum: refused at resolve
        load_config({"job": "datagen.generate", "roles": {"reasoner": "oracle"}})
    cfg = load_config({"job": "datagen.generate", "envs": ["MathApi"], "output_dir": str(tmp_path)})
    from palaestra.datagen.generate import build_graph

    with pytest.raises(UnknownNameError, match="MathAPI"):
        build_graph(cfg.envs)
