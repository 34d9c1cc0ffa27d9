"""Ray: start or join a cluster, and map work over workers.

`init(cfg)` starts a small local instance (no dashboard, a small object
store) unless ``cluster.address`` names an existing cluster. `parallel_map`
is the one place that fans work out: it runs a function over items as Ray
tasks with per-task CPU/GPU requests, retries tasks whose worker died, shows a
progress bar, and returns results in input order. With ``keep_going`` a task
that raises yields a `TaskFailure` in its slot instead of sinking the batch.

Starting under load: Ray waits a fixed 30 s for the raylet to register
(``ray._private.node``, "The current node timed out during startup") and 30 s
for the GCS port (``RAY_gcs_server_port_wait_time_s``). On a busy machine both
can pass. `init` stretches both to ``cluster.start_timeout_s`` and tries
``cluster.start_attempts`` times, killing what a failed try left running. If
Ray still does not start, it raises `ClusterStartError`: one line naming the
cause and the settings to change (the CLI prints it and exits with 2).

Send registry names and configs to workers, not live objects: the worker
resolves them.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from palaestra.shared import reproducibility
from palaestra.shared.config import ClusterConfig, ConfigError
from palaestra.shared.extras import require


@dataclass
class TaskFailure:
    """What a failed task left behind (with ``keep_going=True``)."""

    item: Any
    error: str


class ClusterStartError(ConfigError):
    """Ray did not start; the message names the cause and the settings to change."""


class _StartTimedOut(Exception):
    """Raised inside Ray's startup wait when ``cluster.start_timeout_s`` has passed."""


def init(cfg: ClusterConfig | None = None, in_process: str | None = None):
    """Connect to Ray (once per process); return the `ray` module.

    `in_process`: the setting that runs the caller's work without Ray (e.g. ``workers.num_workers=0``), named in the
    error line when Ray cannot start."""
    ray = require("ray", "ray", "Ray workers (cluster, rollout workers, parallel maps)")

    cfg = cfg or ClusterConfig()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    env_vars = reproducibility.worker_env()
    runtime_env = {"env_vars": env_vars} if env_vars else None
    if cfg.address:
        ray.init(address=cfg.address, ignore_reinit_error=True, log_to_driver=True, runtime_env=runtime_env)
        return ray
    causes = []
    for _ in range(cfg.start_attempts):
        try:
            with _patient_start(ray, cfg.start_timeout_s) as nodes:
                try:
                    ray.init(
                        num_cpus=cfg.num_cpus,
                        num_gpus=cfg.num_gpus,
                        include_dashboard=False,
                        object_store_memory=cfg.object_store_mb * 1024 * 1024,
                        ignore_reinit_error=True,
                        configure_logging=False,
                        log_to_driver=True,
                        runtime_env=runtime_env,
                    )
                except BaseException:
                    _kill(ray, nodes)
                    raise
            return ray
        except (_StartTimedOut, TimeoutError) as err:
            causes.append(str(err) or type(err).__name__)
        except Exception as err:  # Ray's own startup errors (a raylet or GCS that did not come up)
            if not _is_start_failure(err):
                raise
            causes.append(_short_error(err))
    raise ClusterStartError(_start_failure_line(cfg, causes[-1], in_process))


def _start_failure_line(cfg: ClusterConfig, cause: str, in_process: str | None) -> str:
    load = f", load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs" if hasattr(os, "getloadavg") else ""
    fix = f"raise cluster.start_timeout_s (now {cfg.start_timeout_s:g}) or cluster.start_attempts, or set "
    fix += "cluster.address to a running cluster (ray start --head; cluster.address=auto)"
    fix += f", or run this job without Ray: {in_process}" if in_process else ""
    return f"Ray did not start in {cfg.start_attempts} attempt(s) of {cfg.start_timeout_s:g} s ({cause}{load}): {fix}"


def _is_start_failure(err: Exception) -> bool:
    text = str(err)
    return any(s in text for s in ("timed out during startup", "Timed out", "Failed to connect", "GCS"))


_GCS_PORT_WAIT = "RAY_gcs_server_port_wait_time_s"
"""Ray's (lower-case) variable for the seconds to wait for the GCS port; a value set by hand wins."""


@contextlib.contextmanager
def _patient_start(ray, timeout_s: float):
    """Inside: Ray's startup waits last `timeout_s` (no less, no more); yields the nodes started, to kill on failure.

    Ray polls ``services.get_node`` in a loop with a fixed 30 s budget; here each poll waits for the node itself
    until `timeout_s` has passed, then raises `_StartTimedOut`, which ends Ray's loop at once."""
    services, node_mod = ray._private.services, ray._private.node
    get_node, node_init = services.get_node, node_mod.Node.__init__
    deadline = time.monotonic() + timeout_s
    nodes: list = []

    def patient_get_node(gcs_address, node_id):
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError as err:
                if time.monotonic() > deadline:
                    raise _StartTimedOut(f"the raylet did not register within {timeout_s:g} s") from err
                time.sleep(0.2)

    def recording_init(self, *args, **kwargs):
        nodes.append(self)
        node_init(self, *args, **kwargs)

    saved = os.environ.get(_GCS_PORT_WAIT)
    os.environ[_GCS_PORT_WAIT] = saved or str(max(1, math.ceil(timeout_s)))
    services.get_node, node_mod.Node.__init__ = patient_get_node, recording_init
    try:
        yield nodes
    finally:
        services.get_node, node_mod.Node.__init__ = get_node, node_init
        if saved is None:
            os.environ.pop(_GCS_PORT_WAIT, None)


def _kill(ray, nodes: list) -> None:
    """Stop what a failed start left running, so that the next try starts clean."""
    for node in nodes:
        with contextlib.suppress(Exception):
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    with contextlib.suppress(Exception):
        ray.shutdown()


def parallel_map(
    fn: Callable,
    items: Iterable,
    *,
    num_cpus: float = 1,
    num_gpus: float = 0,
    max_retries: int = 2,
    keep_going: bool = False,
    desc: str = "tasks",
    cluster: ClusterConfig | None = None,
    progress: bool = True,
    in_process: str | None = None,
) -> list:
    """``[fn(item) for item in items]`` as Ray tasks, in order, with a progress bar (`in_process`: see `init`)."""
    from tqdm import tqdm

    ray = init(cluster, in_process=in_process)
    items = list(items)
    remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=max_retries, retry_exceptions=False)(fn)
    refs = [remote.remote(item) for item in items]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list = [None] * len(refs)
    pending = list(refs)
    with tqdm(total=len(refs), desc=desc, disable=not progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except Exception as err:
                    if not keep_going:
                        raise
                    results[i] = TaskFailure(items[i], _short_error(err))
                bar.update(1)
    return results


def _short_error(err: Exception) -> str:
    cause = getattr(err, "cause", None) or err
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
