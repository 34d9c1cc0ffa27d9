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

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from palaestra.shared.config import ConfigError, JobConfig, registry_kwargs, registry_name
from palaestra.shared.jobs import job
from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.tracking import Tracker


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


def run_sft(model, tokenizer, opts: SFTOptions, progress: bool = False, on_step=None) -> dict[str, float]:
    """Train `model` in place for ``opts.steps`` steps; returns first/last loss."""
    samples = [tokenize(tokenizer, s, opts.max_length) for s in load_samples(opts)]
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
        loss = sft_loss(model, batch, tokenizer.pad_token_id)
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
