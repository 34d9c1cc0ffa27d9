"""Supervised fine-tuning on chat data with tools: loss on the assistant's tokens only.

Samples are OpenAI-style ``messages`` (with assistant turns, tool calls and tool
results) plus optional ``tools``, from a JSONL file or a registered task source.
They are tokenized by the same chat template the rollouts use; the template's
``{% generation %}`` markers give the assistant-token mask
(``return_assistant_tokens_mask``), so system, user and tool tokens carry no loss.

`run_sft` trains a model in place (the RL trainer's warm-up uses it); the
``rl.sft`` job loads a model, trains it and saves it as an HF directory that
``llm.model`` can point at.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.config_checks import registry_kwargs, registry_name
from palaestra.shared.jobs import job
from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.tracking import Tracker

# torch is imported in the functions that compute: the job's config loads without it (`palaestra show`)
if TYPE_CHECKING:
    import torch


@dataclass
class SFTOptions:
    """An SFT stage."""

    steps: int = 0
    """Optimizer steps (0: no SFT)."""
    data_path: str | None = None
    """JSONL file, one sample per line: ``{"messages": [...], "tools": [...]}``."""
    source: str | None = field(default=None, metadata=registry_name("palaestra.shared.rollout.tasks:TASKS"))
    """Or a registered task source (`TASKS`) whose samples carry full conversations."""
    source_kwargs: dict[str, Any] = field(default_factory=dict, metadata=registry_kwargs("source"))
    batch_size: int = 16
    lr: float = 1e-3
    max_length: int = 2048
    """Longer samples are cut (their tail carries no loss)."""
    seed: int = 0
    cache_dir: str | None = None
    """Keep the trained weights here, keyed by everything that decides them (`warm_start_key`), and load them
    instead of training again: the arms and runs of a matrix that share a warm start train it once. Exact: the
    same key gives the same weights bit for bit on the same machine and torch build."""


def load_samples(opts: SFTOptions) -> list[dict]:
    if opts.data_path:
        path = Path(opts.data_path)
        if not path.is_file():
            raise ConfigError(f"sft data file not found: {path}")
        samples = [value for _, value in read_jsonl(path)]
    elif opts.source:
        from palaestra.shared.rollout.tasks import TASKS

        samples = TASKS.get(opts.source)(**opts.source_kwargs)
    else:
        raise ConfigError("sft: set data_path (a JSONL file) or source (a registered task source)")
    for i, s in enumerate(samples):
        if not any(m.get("role") == "assistant" for m in s.get("messages", [])):
            raise ConfigError(f"sft sample {i} has no assistant message to learn from")
    return samples


def tokenize(tokenizer, sample: dict, max_length: int) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its assistant-token mask."""
    out = tokenizer.apply_chat_template(
        sample["messages"],
        tools=sample.get("tools") or None,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    if not any(mask):
        raise ValueError("the chat template marks no assistant tokens (it needs {% generation %} markers)")
    if not any(mask[:max_length]):  # else the batch loss would be 0/0 = NaN mid-run
        raise ConfigError(
            f"sft: max_length {max_length} cuts every assistant token of a {len(ids)}-token conversation "
            f"(its first assistant token is at {mask.index(1)}); raise max_length"
        )
    return ids[:max_length], mask[:max_length]


def sft_loss(model, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over the assistant tokens of a batch."""
    import torch

    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, (ids, mask) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(ids), -100)
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1).to(device), ignore_index=-100
    )


def warm_start_key(model, samples: list[tuple[list[int], list[int]]], opts: SFTOptions) -> str:
    """sha256 of what decides an SFT run's result: the starting weights (and which train), the tokenized
    samples, the options and the torch build."""
    import torch

    h = hashlib.sha256(f"{torch.__version__} {opts.steps} {opts.batch_size} {opts.lr} {opts.seed}".encode())
    for name, p in model.state_dict().items():
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    h.update(" ".join(n for n, p in model.named_parameters() if p.requires_grad).encode())
    h.update(json.dumps(samples).encode())
    return h.hexdigest()[:32]


def run_sft(model, tokenizer, opts: SFTOptions, progress: bool = False, on_step=None) -> dict[str, float]:
    """Train `model` in place for ``opts.steps`` steps; returns first/last loss. With ``opts.cache_dir`` a
    warm start trained before with the same key is loaded instead (no per-step `on_step` calls then)."""
    import torch

    samples = [tokenize(tokenizer, s, opts.max_length) for s in load_samples(opts)]
    cached = Path(opts.cache_dir) / warm_start_key(model, samples, opts) if opts.cache_dir and opts.steps else None
    if cached is not None and (cached / "metrics.json").is_file():
        model.load_state_dict(torch.load(cached / "model.pt", map_location="cpu", weights_only=True))
        model.eval()
        print(f"sft: warm start loaded from {cached}", flush=True)
        return json.loads((cached / "metrics.json").read_text())
    metrics = _train(model, tokenizer.pad_token_id, samples, opts, progress, on_step)
    if cached is not None:  # written under a temporary name, then renamed: parallel runs may race here
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), tmp / "model.pt")
        (tmp / "metrics.json").write_text(json.dumps(metrics))
        try:
            tmp.rename(cached)
        except OSError:  # another run stored the same key first
            shutil.rmtree(tmp, ignore_errors=True)
    return metrics


def _train(model, pad_id: int, samples, opts: SFTOptions, progress: bool, on_step) -> dict[str, float]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=opts.lr)
    rng = random.Random(opts.seed)
    model.train()
    losses = []
    order: list[int] = []
    for step in tqdm(range(opts.steps), desc="sft steps", disable=not progress):
        while len(order) < opts.batch_size:  # epochs of shuffled samples: each seen once per epoch
            epoch = list(range(len(samples)))
            rng.shuffle(epoch)
            order += epoch
        batch = [samples[i] for i in order[: opts.batch_size]]
        del order[: opts.batch_size]
        loss = sft_loss(model, batch, pad_id)
        if not torch.isfinite(loss):
            raise RuntimeError(f"sft: non-finite loss ({loss.item()}) at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        if on_step:
            on_step(step + 1, loss.item())
    model.eval()
    return {"loss_first": losses[0], "loss_last": losses[-1]} if losses else {}


@dataclass
class SFTJobConfig(JobConfig):
    """SFT of a model on chat data with tools (assistant tokens only)."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    sft: SFTOptions = field(default_factory=lambda: SFTOptions(steps=100))
    save_dir: str | None = None
    """Where the trained model goes as an HF directory (default ``<output_dir>/sft_model``)."""


@job("rl.sft", SFTJobConfig)
def rl_sft(cfg: SFTJobConfig, tracker: Tracker) -> dict:
    """Supervised fine-tuning on chat data (loss on assistant tokens), saved as an HF model directory."""
    import palaestra.shared.rollout.tasks  # noqa: F401  (built-in task sources)
    from palaestra.shared.llm.base import make_client

    client = make_client(cfg.llm)
    on_step = lambda step, loss: tracker.log_metrics({"sft/loss": loss}, step=step)  # noqa: E731
    metrics = run_sft(client.model, client.tokenizer, cfg.sft, progress=True, on_step=on_step)
    out = Path(cfg.save_dir or Path(cfg.output_dir) / "sft_model")
    client.model.save_pretrained(out)
    client.tokenizer.save_pretrained(out)
    return {**metrics, "model_dir": str(out)}
