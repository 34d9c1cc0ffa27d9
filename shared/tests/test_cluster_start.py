"""A local Ray start on a busy machine: `cluster.start_timeout_s` governs the wait, and a start that never comes
ends in one line naming the cause and what to change, with nothing left running.

Each case runs in its own process (Ray starts once per process). The artificial delay: Ray's node lookup
(`ray._private.services.get_node`, which Ray polls until the raylet has registered) fails for the first
``delay`` seconds, as it does while a loaded machine starts the raylet."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import psutil
    import ray._private.services as services
    from palaestra.shared import cli, cluster
    from palaestra.shared.config import ClusterConfig

    delay, timeout, first_only = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
    real, t0, first = services.get_node, time.monotonic(), []

    def slow_get_node(gcs_address, node_id):
        first[:] = first or [gcs_address]  # with first_only, only the first try's node is slow
        if time.monotonic() - t0 < delay and (gcs_address in first or not first_only):
            raise RuntimeError("node not registered yet")
        return real(gcs_address, node_id)

    services.get_node = slow_get_node
    cfg = ClusterConfig(num_cpus=1, object_store_mb=80, start_timeout_s=timeout, start_attempts=2)
    try:
        ray = cluster.init(cfg, in_process="workers.num_workers=0")
        out = {"ok": True, "cpus": ray.cluster_resources().get("CPU"), "waited": time.monotonic() - t0}
        ray.shutdown()
    except Exception as err:
        left = [p.name() for p in psutil.Process().children(recursive=True) if "ray" in " ".join(p.cmdline())]
        out = {"ok": False, "line": cli.one_line_error(err), "left": left, "waited": time.monotonic() - t0}
    print(json.dumps(out))
    """
)


def start(delay: float, timeout: float, first_only: bool = False) -> dict:
    args = [sys.executable, "-c", SCRIPT, str(delay), str(timeout), str(int(first_only))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_start_slower_than_the_timeout_ends_in_one_line_and_leaves_nothing_running():
    out = start(delay=1000, timeout=2)
    assert not out["ok"]
    line = out["line"]
    assert line is not None and "\n" not in line
    assert "did not start in 2 attempt(s) of 2 s" in line and "raylet did not register" in line
    assert "cluster.start_timeout_s" in line and "workers.num_workers=0" in line
    assert out["left"] == []  # each failed try killed its raylet and GCS
    assert out["waited"] < 55  # two tries of 2 s each (plus starting Ray), not two of Ray's fixed 30 s


@pytest.mark.slow
def test_a_start_slower_than_ray_default_poll_but_within_the_timeout_succeeds():
    # the same delay with a longer timeout: the wait is what `start_timeout_s` says
    out = start(delay=3, timeout=120)
    assert out["ok"] and out["cpus"] == 1.0 and out["waited"] >= 3


@pytest.mark.slow
def test_a_second_try_starts_when_the_first_timed_out():
    out = start(delay=1000, timeout=2, first_only=True)
    assert out["ok"] and out["cpus"] == 1.0


def test_the_cluster_start_error_is_a_one_line_cli_error():
    from palaestra.shared import cli
    from palaestra.shared.cluster import ClusterStartError, _start_failure_line
    from palaestra.shared.config import ClusterConfig

    line = _start_failure_line(ClusterConfig(start_timeout_s=5), "the raylet did not register within 5 s", None)
    assert cli.one_line_error(ClusterStartError(line)) == line
    assert "cluster.address" in line and "without Ray" not in line  # the caller named no in-process setting


WORKER_ENV = textwrap.dedent(
    """
    import json, os
    from palaestra.shared import cluster, reproducibility
    from palaestra.shared.config import ClusterConfig

    reproducibility.apply_env()
    ray = cluster.init(ClusterConfig(num_cpus=1, object_store_mb=80))
    def look():
        return {k: os.environ.get(k) for k in reproducibility.PINNED_ENV}, ray.get_runtime_context().runtime_env

    seen, runtime_env = ray.get(ray.remote(look).remote())
    print(json.dumps([seen, runtime_env.get("env_vars", {})]))
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_ray_workers_run_under_the_drivers_reproducibility_pins():
    from palaestra.shared import reproducibility

    env = {k: v for k, v in os.environ.items() if k not in reproducibility.PINNED_ENV}
    proc = subprocess.run([sys.executable, "-c", WORKER_ENV], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen, sent = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == reproducibility.PINNED_ENV
    # sent as the job's runtime environment, so that workers of a cluster started elsewhere get them too
    assert {k: sent[k] for k in reproducibility.PINNED_ENV} == reproducibility.PINNED_ENV


def test_jobs_that_can_run_without_ray_name_the_setting_in_the_line(monkeypatch):
    """Rollout workers and the sharded learner can each run in process: their start failure says how (the setting
    reaches `cluster.init`, which writes the line); `parallel_map` forwards its caller's (a matrix's, datagen's)."""
    from palaestra.shared import cluster
    from palaestra.shared.config import ClusterConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.rl.config import LearnerConfig, TrainConfig
    from palaestra.shared.rl.distributed import DistributedLearner
    from palaestra.shared.rollout.engine import RolloutConfig
    from palaestra.shared.rollout.workers import RayRollouts

    def failing(cfg=None, in_process=None):
        raise cluster.ClusterStartError(_start_line(cfg or ClusterConfig(), in_process))

    def _start_line(cfg, in_process):
        return cluster._start_failure_line(cfg, "the raylet did not register within 1 s", in_process)

    monkeypatch.setattr(cluster, "init", failing)
    with pytest.raises(cluster.ClusterStartError, match=r"without Ray: workers\.num_workers=0$"):
        RayRollouts(LLMConfig(model="tiny"), RolloutConfig(), num_workers=1)
    with pytest.raises(cluster.ClusterStartError, match=r"without Ray: learner\.world_size=1$"):
        DistributedLearner(TrainConfig(learner=LearnerConfig(world_size=2)))
    with pytest.raises(cluster.ClusterStartError, match=r"without Ray: matrix\.parallel=false$"):
        cluster.parallel_map(len, [[1]], in_process="matrix.parallel=false")
