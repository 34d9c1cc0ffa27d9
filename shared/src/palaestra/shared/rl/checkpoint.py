"""Trainer checkpoints: the model (HF ``save_pretrained``; LoRA: the adapter), optimizer, RNG states, step.

Layout under ``<output_dir>/checkpoints``::

    step_000010/            model (loadable as an HF directory with its tokenizer) + trainer_state.pt
                            (+ sharded/: the sharded learner's torch.distributed.checkpoint files) + manifest.json
    reference/              the frozen reference model (when KL is on), saved once at the start; manifest.json

With a ``policies`` section (rl/policies.py) each policy has its subdirectory::

    step_000010/            trainer_state.pt (step, RNG states) + manifest.json
      <name>/               the policy's model (an HF directory with its tokenizer; LoRA: its adapter)
                            + optimizer.pt (+ sharded/: its own sharded learner's files)
    policies/<name>/reference/   its frozen reference (when KL is on)

A checkpoint is written to a temporary directory and renamed, so a crash never
leaves a half-written ``step_*`` behind.

Loading runs only what the run itself wrote. torch's distributed-checkpoint loader unpickles
``sharded/.metadata`` (and any non-tensor entries of the data files), so a crafted file there would run code
on every learner rank at resume. Saving therefore ends with ``manifest.json``: the sha256 of every file of
the checkpoint; `load` and `load_reference` check it before reading anything (`verify`) and refuse, in one
line naming the file, a file that differs, is missing or was added, and a checkpoint without a manifest.
``trainer_state.pt`` is moreover read with ``weights_only``. Hashing reads each file once (several threads).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NUMPY_ARRAY_GLOBALS: list[Any] = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
"""What unpickling a numpy array needs (``_reconstruct``, the array and dtype classes), and nothing else."""
MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that is not the one its run wrote (a file changed, missing or added, or no manifest)."""


def save(root: Path, step: int, model, tokenizer, optimizer, extra: Callable[[Path], None] | None = None) -> Path:
    """Write step `step` under `root`; `extra(dir)` adds more to it before the rename (the sharded learner's state)."""
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {"step": step, "optimizer": optimizer.state_dict(), "rng": rng_state()}
    torch.save(state, tmp / "trainer_state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    if extra is not None:
        extra(tmp)
    write_manifest(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def save_policies(
    root: Path,
    step: int,
    policies: dict[str, tuple[Any, Any, Any, str | None]],
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write step `step` of several policies under `root`: ``{name: (model, tokenizer, optimizer, adapter)}``,
    each in its subdirectory (`adapter`: the policy's LoRA adapter on a base model holding several, saved
    alone); the step and RNG states once, in ``trainer_state.pt``; `extra(dir)` adds more before the rename
    (each sharded learner's state, in its policy's subdirectory)."""
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, (model, tokenizer, optimizer, adapter) in policies.items():
        if adapter is None:
            model.save_pretrained(tmp / name)
        else:
            save_adapter(model, adapter, tmp / name)
        tokenizer.save_pretrained(tmp / name)
        torch.save({"optimizer": optimizer.state_dict()}, tmp / name / "optimizer.pt")
    torch.save({"step": step, "rng": rng_state(), "policies": list(policies)}, tmp / "trainer_state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "policies": list(policies)}))
    if extra is not None:
        extra(tmp)
    write_manifest(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def load_policies(path: Path, policies: dict[str, tuple[Any, Any, str | None]]) -> int:
    """Restore every policy's weights and optimizer (``{name: (model, optimizer, adapter)}``) and the RNG states
    from `path` (checked against its manifest first); return its step. A policy the checkpoint lacks is an
    error."""
    verify(path)
    with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
        state = torch.load(path / "trainer_state.pt", weights_only=True)
    saved = state.get("policies")
    if saved is None or set(saved) != set(policies):
        raise CheckpointError(
            f"{path}: holds policies {saved or 'none (a single-policy checkpoint)'}, the run has {list(policies)}"
        )
    for name, (model, optimizer, adapter) in policies.items():
        load_weights(path / name, model, adapter or "default")
        optimizer.load_state_dict(torch.load(path / name / "optimizer.pt", weights_only=True)["optimizer"])
    set_rng_state(state["rng"])
    return int(state["step"])


def latest(root: Path) -> Path | None:
    steps = sorted(p for p in Path(root).glob("step_*") if (p / "trainer_state.pt").is_file())
    return steps[-1] if steps else None


def prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in Path(root).glob("step_*") if (p / "trainer_state.pt").is_file())
    for old in steps[: max(0, len(steps) - max(keep, 1))]:
        shutil.rmtree(old, ignore_errors=True)


def load(path: Path, model, optimizer) -> int:
    """Restore weights, optimizer and RNG states from `path` (all of its files checked against its manifest
    first, the sharded learner's included, which it loads later from the same directory); return its step."""
    verify(path)
    load_weights(path, model)
    # weights_only: a crafted trainer_state.pt cannot run code; numpy's RNG state (an array) is allowlisted
    with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
        state = torch.load(path / "trainer_state.pt", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return int(state["step"])


def save_adapter(model, adapter: str, path: Path) -> None:
    """One LoRA adapter of a peft model that holds several, as ``save_pretrained`` writes a single one."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    Path(path).mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=adapter)
    save_file({k: v.detach().contiguous() for k, v in state.items()}, Path(path) / "adapter_model.safetensors")
    model.peft_config[adapter].save_pretrained(path)


def load_weights(path: Path, model, adapter: str = "default") -> None:
    """The weights in `path` into `model` (an adapter directory: into its adapter `adapter`)."""
    from safetensors.torch import load_file

    path = Path(path)
    if (path / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(path / "adapter_model.safetensors"), adapter_name=adapter)
        return
    files = (
        [path / "model.safetensors"] if (path / "model.safetensors").is_file() else sorted(path.glob("*.safetensors"))
    )
    if not files:
        raise FileNotFoundError(f"no model weights (*.safetensors) in {path}")
    state = {}
    for f in files:
        state.update(load_file(f))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"checkpoint {path} has weights the model does not: {result.unexpected_keys[:3]}")
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in result.missing_keys if k not in tied and not k.endswith("lm_head.weight")]
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights: {missing[:3]}")


def save_reference(root: Path, model) -> None:
    model.save_pretrained(Path(root) / "reference")
    write_manifest(Path(root) / "reference")


def load_reference(root: Path, model) -> None:
    verify(Path(root) / "reference")
    load_weights(Path(root) / "reference", model)


def _files(path: Path) -> list[str]:
    """Every file under `path` but the manifest, relative, sorted."""
    return sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_file() and f.name != MANIFEST)


def _sha256(file: Path) -> str:
    with open(file, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _hashes(path: Path, names: list[str]) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda name: _sha256(path / name), names)))


def write_manifest(path: Path) -> None:
    """Record the sha256 of every file of the checkpoint directory `path` in its ``manifest.json``."""
    path = Path(path)
    manifest = {"sha256": _hashes(path, _files(path))}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def verify(path: Path) -> None:
    """Raise `CheckpointError` unless the files of `path` are exactly those its manifest lists, byte for byte."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"{path / MANIFEST}: missing; refusing to load a checkpoint this trainer did not write")
    try:
        listed = json.loads((path / MANIFEST).read_text())["sha256"]
        assert isinstance(listed, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise CheckpointError(f"{path / MANIFEST}: not a checkpoint manifest") from None
    present = _files(path)
    added = sorted(set(present) - set(listed))
    if added:
        raise CheckpointError(f"{path / added[0]}: not in the checkpoint's manifest (added after it was saved)")
    missing = sorted(set(listed) - set(present))
    if missing:
        raise CheckpointError(f"{path / missing[0]}: listed in the checkpoint's manifest but missing")
    for name, digest in _hashes(path, present).items():
        if digest != listed[name]:
            raise CheckpointError(f"{path / name}: its sha256 differs from the one written at save; refusing to load")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@torch.no_grad()
def merged_lora_state(peft_model) -> dict[str, torch.Tensor]:
    """The base model's state dict with each LoRA delta added in (the adapters stay as they are)."""
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer):
            adapter = module.active_adapters[0]
            deltas[_clean(name) + ".weight"] = module.get_delta_weight(adapter)
    out = {}
    for name, value in peft_model.state_dict().items():
        if "lora_" in name:
            continue
        key = _clean(name.replace(".base_layer", ""))
        out[key] = value + deltas[key] if key in deltas else value
    return out


def _clean(name: str) -> str:
    return name.removeprefix("base_model.model.")
