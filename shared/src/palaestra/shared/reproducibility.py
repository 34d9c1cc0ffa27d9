"""Bitwise reproducibility across machines of one architecture: one switch, on by default.

Two runs of a command on one machine already give the same bits. Across x86-64 machines they did not: the
libraries pick kernels by what the CPU offers (AVX2, AVX-512, FMA), and each kernel rounds in its own order.
Three hundred SFT steps then amplify the last bits into another figure. The switch pins those choices:

- torch's CPU kernel dispatch (``ATEN_CPU_CAPABILITY=avx2``: AVX-512 machines run the AVX2 kernels);
- MKL's conditional numerical reproducibility (``MKL_CBWR=COMPATIBLE``): the one branch MKL promises to keep
  on Intel and non-Intel CPUs alike (its AVX2 branch falls back to the automatic one on AMD);
- oneDNN's instruction set cap (``ONEDNN_MAX_CPU_ISA=AVX2``);
- thread counts (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``; torch's threads in `apply_torch`): reductions split
  their sums by thread, and torch's default is the machine's core count;
- ``torch.use_deterministic_algorithms`` (with ``CUBLAS_WORKSPACE_CONFIG``, which CUDA's deterministic GEMMs
  need).

The variables must be set before torch loads, in every process: `apply_env` runs first in the CLI, and
`worker_env` goes to Ray workers as their runtime environment (palaestra.shared.cluster).

What the switch cannot remove: a CPU without AVX2 and FMA (before 2013) runs other kernels; another
architecture (ARM) or another torch or MKL build computes differently; and GPUs are deterministic only per
GPU model and driver. Set ``PALAESTRA_REPRODUCIBLE=0`` to let every library pick its fastest kernels
(tools/bench_reproducibility.py measures the cost).
"""

from __future__ import annotations

import os
import sys
import warnings

SWITCH = "PALAESTRA_REPRODUCIBLE"
"""The environment variable that turns the switch off (``0``); anything else, or unset, is on."""

PINNED_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}
"""What the switch sets before torch loads (see the module docstring for why each)."""

FIXED_THREADS = 1
"""torch's intra-op threads under the switch when the job leaves ``torch_threads`` at 0 (torch's default)."""


def enabled() -> bool:
    """Whether the switch is on (it is unless ``PALAESTRA_REPRODUCIBLE=0``)."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def worker_env() -> dict[str, str]:
    """The pinned variables this process runs with, for Ray workers to import torch under (a worker computes as
    the driver does; on a cluster started elsewhere the workers would not inherit them)."""
    return {k: os.environ[k] for k in (*PINNED_ENV, SWITCH) if k in os.environ}


def apply_env() -> bool:
    """Set the pinned variables in this process, before torch is imported; whether they are in force.

    When torch is already loaded (a caller imported it first), its kernels are chosen: the variables are left as
    they are, so that Ray workers compute as this process does, and a warning says so once."""
    global _warned
    if not enabled():
        return False
    if all(os.environ.get(k) == v for k, v in PINNED_ENV.items()):
        return True
    if "torch" in sys.modules:
        if not _warned:
            warnings.warn(
                "the reproducibility switch is not in force: torch was imported before it could pin its kernels "
                "(call palaestra.shared.cli.main, or reproducibility.apply_env, before importing torch)",
                stacklevel=2,
            )
            _warned = True
        return False
    os.environ.update(PINNED_ENV)
    return True


_warned = False


def apply_torch(threads: int) -> None:
    """Set torch's threads (`threads`; 0: torch's default, or `FIXED_THREADS` under the switch) and, under the
    switch, deterministic algorithms."""
    try:
        import torch
    except ImportError:  # a job without torch (e.g. datagen against a server): nothing to pin
        return
    if enabled():
        torch.use_deterministic_algorithms(True, warn_only=True)
        threads = threads or FIXED_THREADS
    if threads > 0:
        torch.set_num_threads(threads)


def weights_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a checkpoint's tensors (``*.safetensors`` under `path`), by name in sorted order: the bits, not
    the file layout."""
    import hashlib
    from pathlib import Path

    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    for file in sorted(Path(path).glob("*.safetensors")):
        tensors = load_file(file)
        for name in sorted(tensors):
            digest.update(name.encode() + str(tensors[name].dtype).encode() + tensors[name].tobytes())
    return digest.hexdigest()
