"""Trainer checkpoints: the model (HF ``save_pretrained``; LoRA: the adapter), optimizer, RNG states, step.

Layout under ``<output_dir>/checkpoints``::

    step_000010/            trainer_state.pt (step, RNG states, the sections) + manifest.json
      <section>/            each policy's model (an HF directory with its tokenizer; LoRA: its adapter)
                            + optimizer.pt (+ sharded/: its own sharded learner's files)
    <reference dir>/reference/   each policy's frozen reference (when KL is on), saved once at the start

Each policy's section is `Part.section` (rl/policies.py): its name with a ``policies`` section, else ``""``,
so a run without one keeps its model in ``step_*/`` itself and its reference in ``reference/``.

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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NUMPY_ARRAY_GLOBALS: list[Any] = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
"""What unpickling a numpy array needs (``_reconstruct``, the array and dtype classes), and nothing else."""
MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that is not the one its run wrote (a file changed, missing or added, or no manifest)."""


@dataclass
class Part:
    """One policy's share of a checkpoint: its section (a subdirectory; ``""``: the step directory itself),
    model, optimizer, tokenizer (saved beside the model) and LoRA adapter (on a base holding several: saved
    alone)."""

    section: str
    model: Any
    optimizer: Any
    tokenizer: Any = None
    adapter: str | None = None


def save(root: Path, step: int, parts: Sequence[Part], extra: Callable[[Path], None] | None = None) -> Path:
    """Write step `step` under `root`: each part in its section, then the step and RNG states once in
    ``trainer_state.pt``; `extra(dir)` adds more before the rename (each sharded learner's state)."""
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for part in parts:
        directory = tmp / part.section
        if part.adapter is None:
            part.model.save_pretrained(directory)
        else:
            save_adapter(part.model, part.adapter, directory)
        if part.tokenizer is not None:
            part.tokenizer.save_pretrained(directory)
        torch.save({"optimizer": part.optimizer.state_dict()}, directory / "optimizer.pt")
    sections = [part.section for part in parts]
    torch.save({"step": step, "rng": rng_state(), "sections": sections}, tmp / "trainer_state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "sections": sections}))
    if extra is not None:
        extra(tmp)
    write_manifest(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def load(path: Path, parts: Sequence[Part]) -> int:
    """Restore every part's weights and optimizer and the RNG states from `path` (all of its files checked
    against its manifest first, the sharded learners' included, which load later from the same directory);
    return its step. A checkpoint of other sections than the run's is an error."""
    verify(path)
    # weights_only: a crafted trainer_state.pt cannot run code; numpy's RNG state (an array) is allowlisted
    with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
        state = torch.load(path / "trainer_state.pt", weights_only=True)
    saved, wanted = state.get("sections"), [part.section for part in parts]
    if saved is None or set(saved) != set(wanted):
        raise CheckpointError(f"{path}: holds policies {_named(saved)}, the run has {_named(wanted)}")
    for part in parts:
        load_weights(path / part.section, part.model, part.adapter or "default")
        optimizer = torch.load(path / part.section / "optimizer.pt", weights_only=True)["optimizer"]
        part.optimizer.load_state_dict(optimizer)
    set_rng_state(state["rng"])
    return int(state["step"])


def _named(sections: list[str] | None) -> str:
    if not sections:
        return "none"
    return ", ".join(s or "one (no policies section)" for s in sections)


def latest(root: Path) -> Path | None:
    steps = sorted(p for p in Path(root).glob("step_*") if (p / "trainer_state.pt").is_file())
    return steps[-1] if steps else None


def prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in Path(root).glob("step_*") if (p / "trainer_state.pt").is_file())
    for old in steps[: max(0, len(steps) - max(keep, 1))]:
        shutil.rmtree(old, ignore_errors=True)


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
