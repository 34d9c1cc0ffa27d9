"""The files of a public training set: a local file or folder, or a Hugging Face hub dataset read through its cache.

A hub dataset that cannot be read fails with one line naming the set and what to do: not in the cache while
offline (``HF_HUB_OFFLINE=1``), not found, or gated (the Salesforce sets, xlam-function-calling-60k and
APIGen-MT-5k, need their licence accepted on the dataset's page and a token: ``huggingface-cli login`` or
``HF_TOKEN``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from palaestra.shared.jsonl import read_jsonl

GATED_ORGS = ("Salesforce",)
"""Hub organisations whose function-calling sets are gated (a licence to accept, then a token)."""


def resolve_files(path: str, cache_dir: str | None = None) -> list[Path]:
    """The data files of a source: a local file, a local folder's ``.json``/``.jsonl`` files, or a hub dataset."""
    if path.startswith("hf://datasets/"):
        return hub_files(path[len("hf://datasets/") :], cache_dir)
    local = Path(path).expanduser()
    if local.is_dir():
        return sorted(p for p in local.rglob("*") if p.suffix in (".json", ".jsonl"))
    if not local.is_file():
        raise FileNotFoundError(f"training data not found: {path}")
    return [local]


def hub_files(spec: str, cache_dir: str | None = None) -> list[Path]:
    """``<org>/<name>[/<file>]`` of a hub dataset (``@revision`` after the name allowed) as local files."""
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
    except ImportError:
        raise ImportError("hf:// data needs huggingface_hub (pip install 'palaestra-egpo[hub]')") from None
    org, name, *rest = spec.split("/")
    name, _, revision = name.partition("@")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    kwargs: dict[str, Any] = {
        "repo_type": "dataset",
        "revision": revision or None,
        "cache_dir": cache_dir or os.environ.get("HF_HUB_CACHE"),
        "local_files_only": offline,
    }
    try:
        if rest:
            return [Path(str(hf_hub_download(f"{org}/{name}", "/".join(rest), **kwargs)))]
        root = Path(str(snapshot_download(f"{org}/{name}", allow_patterns=["*.json", "*.jsonl"], **kwargs)))
    except Exception as err:  # huggingface_hub's errors name neither the set nor the way out
        raise FileNotFoundError(hub_error(f"{org}/{name}", err, offline)) from None
    return sorted(p for p in root.rglob("*") if p.suffix in (".json", ".jsonl"))


def hub_error(repo: str, err: Exception, offline: bool) -> str:
    """One line for a hub dataset that could not be read: which set, why, and how to get it."""
    kind = type(err).__name__
    gated = repo.split("/")[0] in GATED_ORGS or "Gated" in kind
    access = (
        f"; it is gated: accept its licence at https://huggingface.co/datasets/{repo} and log in "
        "(huggingface-cli login, or set HF_TOKEN)"
        if gated
        else ""
    )
    where = "not in the hub cache (HF_HUB_OFFLINE is set: download it once online)" if offline else "not readable"
    return f"hub dataset {repo}: {where} ({kind}){access}; or give a local file as `path`"


def read_records(path: Path) -> list[Any]:
    """The records of a ``.jsonl`` file or of a ``.json`` file holding an array (or one object)."""
    if path.suffix == ".jsonl":
        return [value for _, value in read_jsonl(path)]
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]
