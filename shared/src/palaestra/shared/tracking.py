"""MLflow tracking: one run per job, nested runs per stage.

`Tracker.start(cfg)` opens a run that records the flattened config as params,
the resolved config as ``config.yaml``, and tags (git commit, package
versions, seed). Jobs log metrics per step and artifacts through it.

Default store: ``sqlite:///mlruns/mlflow.db`` with artifacts under
``mlruns/artifacts`` (an explicit location, so runs are portable); any other
tracking URI works too, including a remote ``mlflow server``.

Ray workers log into their own child run: the driver creates it with
`Tracker.child_run_id` and the worker attaches with `Tracker.attach`.

Figures: `new_figure` makes a matplotlib figure without pyplot (no GUI
backend, no global state to leak), `Tracker.log_figure` logs it through
MLflow's own ``log_figure`` as ``figures/<name>.png``, or, given a step, as
``figures/<name>/step_<step>.png`` so that plots of successive evaluations sit
side by side instead of overwriting each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from palaestra.shared.config import TrackingConfig, flatten, to_yaml

PACKAGES = (
    "palaestra-shared",
    "palaestra-datagen",
    "palaestra-egpo",
    "palaestra-mars",
    "palaestra-aed",
    "torch",
    "transformers",
    "ray",
    "mlflow",
    "vllm",
)
MAX_PARAM_LEN = 6000


def default_uri() -> str:
    return f"sqlite:///{Path('mlruns').absolute() / 'mlflow.db'}"


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<db>.lock`` beside a sqlite store. Jobs started together on a new store each
    ran MLflow's schema migrations and all but one died ('duplicate column name: step'); under the lock the
    first creates the store and the others find it made. Other stores need no lock."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:  # closing the file releases the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _mlflow():
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    return mlflow


class Tracker:
    """A handle on one MLflow run (or on none, when tracking is disabled)."""

    def __init__(self, cfg: TrackingConfig, run_id: str | None = None):
        self.cfg = cfg
        self.run_id = run_id
        self.uri = cfg.uri or default_uri()
        self._mlflow_client = None

    # -- lifecycle -------------------------------------------------------
    @classmethod
    @contextlib.contextmanager
    def start(cls, job_cfg: Any, name: str | None = None, parent_run_id: str | None = None) -> Iterator[Tracker]:
        """Open a run for `job_cfg` (a resolved `JobConfig`), nested if a run is active, or else under
        `parent_run_id` (a run of another process: a matrix's combinations on Ray)."""
        cfg: TrackingConfig = job_cfg.tracking
        if not cfg.enabled:
            yield cls(cfg)
            return
        mlflow = _mlflow()
        tracker = cls(cfg)
        mlflow.set_tracking_uri(tracker.uri)
        experiment_id = tracker._experiment_id(cfg.experiment)
        nested = mlflow.active_run() is not None
        tags = {"mlflow.parentRunId": parent_run_id} if parent_run_id and not nested else None
        with mlflow.start_run(
            experiment_id=experiment_id, run_name=name or cfg.run_name or job_cfg.job, nested=nested, tags=tags
        ) as run:
            tracker.run_id = run.info.run_id
            tracker._record_config(job_cfg)
            try:
                yield tracker
            except BaseException:
                mlflow.set_tag("palaestra.status", "failed")
                raise

    @classmethod
    @contextlib.contextmanager
    def attach(cls, cfg: TrackingConfig, run_id: str | None) -> Iterator[Tracker]:
        """Resume an existing run (e.g. a child run made by the driver) from any process."""
        if not cfg.enabled or run_id is None:
            yield cls(cfg)
            return
        mlflow = _mlflow()
        tracker = cls(cfg, run_id)
        mlflow.set_tracking_uri(tracker.uri)
        with mlflow.start_run(run_id=run_id):
            yield tracker

    def child_run_id(self, name: str, params: Mapping[str, Any] | None = None) -> str | None:
        """Create a child run of this one (to be filled by another process); return its id."""
        if self.run_id is None:
            return None
        client = self._client()
        parent = client.get_run(self.run_id)
        run = client.create_run(parent.info.experiment_id, run_name=name, tags={"mlflow.parentRunId": self.run_id})
        client.set_terminated(run.info.run_id, "RUNNING")
        for key, value in (params or {}).items():
            client.log_param(run.info.run_id, key, _param(value))
        return run.info.run_id

    # -- logging ---------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.run_id is None:
            return
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self._client().log_batch(self.run_id, metrics=[_metric(k, v, step) for k, v in clean.items()])

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import Param

        items = [Param(k, _param(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._client().log_batch(self.run_id, params=items[i : i + 100])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.run_id is not None:
            for key, value in tags.items():
                self._client().set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.run_id is not None:
            path = Path(path)
            if path.is_dir():
                self._client().log_artifacts(self.run_id, str(path), artifact_path)
            else:
                self._client().log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, filename: str) -> None:
        if self.run_id is not None:
            self._client().log_text(self.run_id, text, filename)

    def log_dict(self, obj: Any, filename: str) -> None:
        self.log_text(json.dumps(obj, indent=2, default=str), filename)

    def log_figure(self, figure: Any, name: str, step: int | None = None, close: bool = True) -> str | None:
        """Log a matplotlib figure as a PNG artifact; return its artifact path (None when tracking is off).

        ``figures/<name>.png``, or ``figures/<name>/step_<step:06d>.png`` with a `step` (one per evaluation).
        `close` releases the figure's memory afterwards (pyplot figures are closed through pyplot).
        """
        artifact = f"figures/{name}.png" if step is None else f"figures/{name}/step_{step:06d}.png"
        try:
            if self.run_id is None:
                return None
            self._client().log_figure(self.run_id, figure, artifact)
            return artifact
        finally:
            if close:
                _close_figure(figure)

    def last_metrics(self) -> dict[str, float]:
        """The last value of every metric of this run (empty when tracking is off)."""
        if self.run_id is None:
            return {}
        return dict(self._client().get_run(self.run_id).data.metrics)

    def artifact_dir(self) -> str | None:
        """Where this run's artifacts are: a local directory (relative to the working directory when inside it),
        or the artifact URI of a remote store; None when tracking is off."""
        if self.run_id is None:
            return None
        uri = self._client().get_run(self.run_id).info.artifact_uri
        if not uri.startswith("file:"):
            return uri
        from urllib.parse import unquote, urlparse

        path = Path(unquote(urlparse(uri).path))
        with contextlib.suppress(ValueError):
            path = path.relative_to(Path.cwd())
        return str(path)

    # -- internals -------------------------------------------------------
    def _client(self):
        if self._mlflow_client is None:  # one client per tracker, not one per logging call
            from mlflow.tracking import MlflowClient

            with _store_lock(self.uri):  # the client creates (and migrates) a new sqlite store
                self._mlflow_client = MlflowClient(self.uri)
        return self._mlflow_client

    def _experiment_id(self, name: str) -> str:
        client = self._client()
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        location = None
        if self.uri.startswith(("sqlite:", "file:")) or "://" not in self.uri:
            root = Path(self.cfg.artifact_root or "mlruns/artifacts").absolute()
            location = root.as_uri()
        try:
            return client.create_experiment(name, artifact_location=location)
        except Exception:  # another process created it meanwhile
            return client.get_experiment_by_name(name).experiment_id

    def _record_config(self, job_cfg: Any) -> None:
        self.log_params(flatten(job_cfg))
        self.log_text(to_yaml(job_cfg), "config.yaml")
        self.set_tags(
            {
                "palaestra.job": job_cfg.job,
                "palaestra.seed": job_cfg.seed,
                "mlflow.source.git.commit": git_commit(),
                **package_versions(),
            }
        )


def new_figure(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    """``(figure, axes)`` from matplotlib's object API (no pyplot, works headless); kwargs go to ``Figure``."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:  # matplotlib comes with mlflow (the `tracking` extra)
        raise ImportError("figures need matplotlib: pip install 'palaestra-shared[tracking]'") from err
    figure = Figure(**kwargs)
    return figure, figure.subplots(nrows, ncols)


def _close_figure(figure: Any) -> None:
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:  # a pyplot figure stays alive in pyplot's registry until closed there
        pyplot.close(figure)


def _metric(key: str, value: float, step: int | None):
    import time

    from mlflow.entities import Metric

    return Metric(key, value, int(time.time() * 1000), step or 0)


def _param(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text[:MAX_PARAM_LEN]


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            out[f"version.{name}"] = version(name)
    return out


def scratch_dir() -> Path:
    """A temp dir for files to log as artifacts."""
    return Path(tempfile.mkdtemp(prefix="palaestra-"))
