"""Test helpers shared by every package's tests (loaded by the root conftest.py).

- torch runs on one thread (two threads on a shared core degrade badly);
- `ray_local`: one small Ray instance for the whole session;
- `tracking`: a `TrackingConfig` on a fresh sqlite MLflow store in a temp dir;
- `tiny_llm`: the embedded `tiny` model through the transformers backend, built once;
- `tiny_server`: `palaestra serve tiny` in a child process (base URL), started once; skipped without the
  `serve` and `openai` extras.
"""

from __future__ import annotations

import os

import pytest

from palaestra.shared.config import ClusterConfig, TrackingConfig

TEST_CLUSTER = ClusterConfig(num_cpus=2, object_store_mb=128)


def pytest_configure(config) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def pytest_collection_modifyitems(config, items) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    from palaestra.shared import cluster

    ray = cluster.init(TEST_CLUSTER)
    yield ray


@pytest.fixture
def tracking(tmp_path) -> TrackingConfig:
    return TrackingConfig(
        experiment="test", uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "artifacts")
    )


@pytest.fixture(scope="session")
def tiny_llm():
    from palaestra.shared.llm import LLMConfig, make_client

    return make_client(LLMConfig(model="tiny", device="cpu"))


@pytest.fixture(scope="session")
def tiny_server():
    """Base URL (``http://127.0.0.1:PORT/v1``) of ``palaestra serve tiny`` in a child process, shared by the session.

    Skips where the `serve` or `openai` extra is not installed (a package installed alone without them)."""
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason=f"needs {module}: pip install 'palaestra-shared[serve,openai]'")
    from palaestra.shared.llm.serve_launch import serve_in_subprocess

    with serve_in_subprocess("tiny") as url:
        yield url
