"""Ray: start or join a cluster, and map work over workers.

`init(cfg)` starts a small local instance (no dashboard, a small object
store) unless ``cluster.address`` names an existing cluster. `parallel_map`
is the one place that fans work out: it runs a function over items as Ray
tasks with per-task CPU/GPU requests, retries tasks whose worker died, shows a
progress bar, and returns results in input order. With ``keep_going`` a task
that raises yields a `TaskFailure` in its slot instead of sinking the batch.

Send registry names and configs to workers, not live objects: the worker
resolves them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from palaestra.shared.config import ClusterConfig
from palaestra.shared.extras import require


@dataclass
class TaskFailure:
    """What a failed task left behind (with ``keep_going=True``)."""

    item: Any
    error: str


def init(cfg: ClusterConfig | None = None):
    """Connect to Ray (once per process); return the `ray` module."""
    ray = require("ray", "ray", "Ray workers (cluster, rollout workers, parallel maps)")

    cfg = cfg or ClusterConfig()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if cfg.address:
        ray.init(address=cfg.address, ignore_reinit_error=True, log_to_driver=True)
    else:
        ray.init(
            num_cpus=cfg.num_cpus,
            num_gpus=cfg.num_gpus,
            include_dashboard=False,
            object_store_memory=cfg.object_store_mb * 1024 * 1024,
            ignore_reinit_error=True,
            configure_logging=False,
            log_to_driver=True,
        )
    return ray


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
) -> list:
    """``[fn(item) for item in items]`` as Ray tasks, in order, with a progress bar."""
    from tqdm import tqdm

    ray = init(cluster)
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
