"""MLflow tracking: one run per job with params, config artifact, metrics, tags; nested stages; a real server."""

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from palaestra.shared.config import JobConfig, TrackingConfig
from palaestra.shared.jobs import job, load_config, run_job
from palaestra.shared.tracking import Tracker


@dataclass
class CountConfig(JobConfig):
    steps: int = 3


@job("test.count", CountConfig)
def count_job(cfg, tracker):
    """Logs a metric per step."""
    for step in range(cfg.steps):
        tracker.log_metrics({"train/value": step * 2.0}, step=step)
    return {"final": cfg.steps * 2.0}


def client(tracking: TrackingConfig):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking.uri)


def test_job_run_records_params_metrics_config_and_tags(tracking):
    cfg = load_config({"job": "test.count", "seed": 7, "steps": 4, "tracking": vars(tracking)})
    result = run_job(cfg)
    run = client(tracking).get_run(result["run_id"])
    assert run.data.params["steps"] == "4"
    assert run.data.params["tracking.experiment"] == "test"
    assert run.data.tags["palaestra.seed"] == "7"
    assert run.data.tags["palaestra.status"] == "finished"
    assert "mlflow.source.git.commit" in run.data.tags
    assert run.data.tags["version.palaestra-shared"] == "0.1.0"
    history = client(tracking).get_metric_history(run.info.run_id, "train/value")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 2.0), (2, 4.0), (3, 6.0)]
    assert run.data.metrics["result/final"] == 8.0
    # the resolved config artifact reloads to the same config
    path = client(tracking).download_artifacts(run.info.run_id, "config.yaml", str(Path(tracking.artifact_root).parent))
    assert yaml.safe_load(Path(path).read_text())["steps"] == 4
    # artifacts live where the config said, not in the working directory
    assert Path(tracking.artifact_root).exists()


def test_pipeline_stages_are_nested_runs(tracking):
    cfg = load_config(
        {
            "job": "pipeline",
            "tracking": vars(tracking),
            "stages": {"a": {"job": "test.count", "steps": 1}, "b": {"job": "test.count", "steps": 2}},
        }
    )
    result = run_job(cfg)
    assert result["a/final"] == 2.0 and result["b/final"] == 4.0
    runs = client(tracking).search_runs(
        [client(tracking).get_experiment_by_name("test").experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'",
    )
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]


@dataclass
class ThreadsConfig(JobConfig):
    torch_threads: int = 1  # a job with its own default, as aed.victim has


@job("test.threads", ThreadsConfig)
def threads_job(cfg, tracker):
    """Reports torch's thread count as the job sees it."""
    import torch

    return {"threads": torch.get_num_threads()}


def test_torch_threads_is_set_for_the_job_and_inherited_by_stages(tracking):
    import torch

    from palaestra.shared.config import ConfigError

    def stage_threads(**pipeline):
        stages = {"s": {"job": "test.threads"}}
        cfg = load_config({"job": "pipeline", "tracking": vars(tracking), "stages": stages, **pipeline})
        return run_job(cfg)["s/threads"]

    before = torch.get_num_threads()
    try:
        assert stage_threads(torch_threads=2) == 2  # the pipeline's value reaches the stage
        assert stage_threads() == 1  # an unset pipeline leaves the job's own default
        with pytest.raises(ConfigError, match="invalid value for .torch_threads.: must be >= 0"):  # at resolve
            stage_threads(torch_threads=-1)
    finally:
        torch.set_num_threads(before)


def test_pipeline_stage_error_names_the_stage(tracking):
    from palaestra.shared.config import ConfigError

    cfg = load_config(
        {"job": "pipeline", "tracking": vars(tracking), "stages": {"bad": {"job": "test.count", "stepz": 1}}}
    )
    with pytest.raises(ConfigError, match="stage 'bad': unknown key 'stepz'"):
        run_job(cfg)


def test_child_run_attached_from_another_process(tracking):
    cfg = load_config({"job": "test.count", "tracking": vars(tracking)})
    with Tracker.start(cfg) as tracker:
        child_id = tracker.child_run_id("worker-0", params={"type": "rear_end"})
        code = (
            "import sys; from palaestra.shared.config import TrackingConfig; "
            "from palaestra.shared.tracking import Tracker\n"
            f"cfg = TrackingConfig(experiment='test', uri={tracking.uri!r})\n"
            f"with Tracker.attach(cfg, {child_id!r}) as t: t.log_metrics({{'m': 3.0}}, step=1)\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    child = client(tracking).get_run(child_id)
    assert child.data.metrics["m"] == 3.0
    assert child.data.params["type"] == "rear_end"
    assert child.data.tags["mlflow.parentRunId"] == tracker.run_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.server
def test_real_mlflow_server_on_loopback(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--default-artifact-root",
            str(tmp_path / "server-artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        uri = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        tracking = TrackingConfig(experiment="remote", uri=uri)
        result = run_job(load_config({"job": "test.count", "steps": 2, "tracking": vars(tracking)}))
        run = client(tracking).get_run(result["run_id"])
        assert run.data.metrics["train/value"] == 2.0
        assert run.data.params["steps"] == "2"
        assert [a.path for a in client(tracking).list_artifacts(run.info.run_id)] == ["config.yaml"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_log_figure_per_step_keeps_every_plot(tracking, tmp_path):
    from mlflow.artifacts import download_artifacts
    from PIL import Image

    from palaestra.shared.tracking import new_figure

    with Tracker.start(CountConfig(job="test.count", tracking=tracking)) as tracker:
        paths = []
        for step, height in ((10, 0.2), (20, 0.8)):
            fig, ax = new_figure(figsize=(3, 2), dpi=50)
            ax.bar([0], [height])
            paths.append(tracker.log_figure(fig, "win_rate", step=step))
        paths.append(tracker.log_figure(new_figure(figsize=(2, 2), dpi=50)[0], "final"))
        run_id = tracker.run_id
    assert paths == ["figures/win_rate/step_000010.png", "figures/win_rate/step_000020.png", "figures/final.png"]
    listed = {a.path for a in client(tracking).list_artifacts(run_id, "figures/win_rate")}
    assert listed == set(paths[:2])
    local = download_artifacts(run_id=run_id, artifact_path=paths[0], dst_path=str(tmp_path), tracking_uri=tracking.uri)
    assert Image.open(local).size == (150, 100)  # 3x2 inches at 50 dpi: a real PNG of the figure
    disabled = Tracker(TrackingConfig(enabled=False))
    assert disabled.log_figure(new_figure()[0], "x", step=1) is None


def _open_store(uri: str, root: str, barrier) -> str:
    from palaestra.shared.tracking import Tracker

    barrier.wait()  # every process opens the new store at the same moment
    return Tracker(TrackingConfig(experiment="race", uri=uri, artifact_root=root))._experiment_id("race")


def test_jobs_started_at_once_on_a_new_sqlite_store_all_run(tmp_path):
    """Two jobs started together on a fresh sqlite store both ran MLflow's schema migrations, and one died
    ('duplicate column name: step'); a lock beside the database lets the first create it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            ids = pool.starmap(_open_store, [(uri, str(tmp_path / "artifacts"), barrier)] * 4)
    assert len(set(ids)) == 1  # one experiment, found or created by each
