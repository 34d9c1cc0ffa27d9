"""The ``llm.generate`` job: prompts (from the config or a file) -> completions in a JSONL artifact.

Prompt sources, in order: ``prompts`` in the config, then ``prompts_file``:

- ``.txt``: one prompt per line (blank lines skipped);
- ``.jsonl``: one object per line, ``{"prompt": "..."}`` or ``{"messages": [...], "tools": [...]}``.

With ``chat: true`` (the default) a text prompt becomes a user message (after
``system`` if set) rendered by the model's chat template; with ``chat: false``
it is sent as raw text. Each output line keeps the prompt, the completion text,
its token ids and logprobs, and the finish reason. The output file is written
batch by batch; ``resume: true`` continues a file left by an interrupted run.
Metrics: tokens/s and latency per batch, and totals.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.config_checks import confined_path, output_file
from palaestra.shared.jobs import format_headline, job
from palaestra.shared.jsonl import read_jsonl
from palaestra.shared.llm.base import LLMConfig, SamplingParams
from palaestra.shared.stats import wilson_interval
from palaestra.shared.tracking import Tracker


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=64)


@dataclass
class LLMGenerateConfig(JobConfig):
    """Generate completions for a list of prompts with any LLM backend."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    """Model and backend."""
    sampling: SamplingParams = field(default_factory=_greedy)
    """Sampling parameters (default: greedy, 64 tokens)."""
    prompts: list[str] = field(default_factory=list)
    """Prompts given inline."""
    prompts_file: str | None = None
    """A .txt (one prompt per line) or .jsonl file ({"prompt": ..} or {"messages": [..], "tools": [..]} per line)."""
    chat: bool = True
    """Render text prompts as a user turn through the chat template (false: raw text completion)."""
    system: str | None = None
    """System message put before each chat prompt."""
    batch_size: int = 16
    """Prompts per generate call (one progress step, one metrics step)."""
    output: str = field(default="completions.jsonl", metadata=output_file())
    """Output file name, under output_dir/<tracking.run_name or 'generate'>/ (never outside output_dir); logged as
    an MLflow artifact."""
    resume: bool = False
    """Continue an existing output file (skip the prompts it already has) instead of overwriting it."""


def load_prompts(cfg: LLMGenerateConfig) -> list[dict]:
    """Each prompt as ``{"prompt": str}`` or ``{"messages": [...], "tools": [...]}``."""
    items: list[dict] = [{"prompt": p} for p in cfg.prompts]
    if cfg.prompts_file:
        path = Path(cfg.prompts_file)
        if not path.exists():
            raise ConfigError(f"prompts_file '{path}' does not exist")
        if path.suffix == ".jsonl":
            for n, obj in read_jsonl(path):
                if not isinstance(obj, dict) or not ({"prompt", "messages"} & obj.keys()):
                    raise ConfigError(f"{path}:{n}: expected an object with 'prompt' or 'messages'")
                items.append(obj)
        else:
            items += [{"prompt": line} for line in path.read_text().splitlines() if line.strip()]
    if not items:
        raise ConfigError("no prompts: set 'prompts' or 'prompts_file'")
    return items


def _conversation(item: dict, cfg: LLMGenerateConfig) -> list[dict]:
    if "messages" in item:
        return item["messages"]
    system = [{"role": "system", "content": cfg.system}] if cfg.system else []
    return [*system, {"role": "user", "content": item["prompt"]}]


@job("llm.generate", LLMGenerateConfig)
def generate(cfg: LLMGenerateConfig, tracker: Tracker) -> dict:
    """Generate completions for prompts (config or file) into a JSONL artifact, with throughput metrics."""
    from tqdm import tqdm

    from palaestra.shared.llm.base import make_client

    items = load_prompts(cfg)
    out_path = confined_path(cfg.output_dir, cfg.tracking.run_name or "generate", cfg.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = 0
    if cfg.resume and out_path.exists():
        done = sum(1 for line in out_path.read_text().splitlines() if line.strip())
    elif out_path.exists():
        out_path.unlink()
    client = make_client(cfg.llm)
    total_tokens, total_seconds, latencies, stops = 0, 0.0, [], 0
    batches = range(done, len(items), max(1, cfg.batch_size))
    with out_path.open("a") as out, tqdm(total=len(items), initial=done, desc="llm.generate", unit="prompt") as bar:
        for step, start in enumerate(batches):
            batch = items[start : start + cfg.batch_size]
            t0 = time.perf_counter()
            if cfg.chat or any("messages" in item for item in batch):
                tools: list[list[dict]] = [item.get("tools") or [] for item in batch]  # [] renders as no tools
                completions = client.chat(
                    [_conversation(item, cfg) for item in batch],
                    cfg.sampling,
                    tools=tools if any(tools) else None,
                )
            else:
                completions = client.generate([item["prompt"] for item in batch], cfg.sampling)
            seconds = time.perf_counter() - t0
            tokens = sum(len(c.token_ids) for c in completions)
            total_tokens, total_seconds = total_tokens + tokens, total_seconds + seconds
            latencies.append(seconds)
            n = cfg.sampling.n
            for k, completion in enumerate(completions):
                stops += completion.finish_reason == "stop"
                record = {
                    "index": start + k // n,
                    "sample": k % n,
                    **batch[k // n],
                    "completion": completion.text,
                    "finish_reason": completion.finish_reason,
                    "num_tokens": len(completion.token_ids),
                    "token_ids": completion.token_ids,
                    "logprobs": completion.logprobs,
                }
                out.write(json.dumps(record) + "\n")
            out.flush()
            bar.update(len(batch))
            tracker.log_metrics(
                {"generate/tokens_per_s": tokens / max(seconds, 1e-9), "generate/batch_latency_s": seconds}, step=step
            )
    client.close()
    tracker.log_artifact(out_path)
    generated = len(items) - done
    summary: dict[str, Any] = {
        "prompts": len(items),
        "generated_prompts": generated,
        "completion_tokens": total_tokens,
        "tokens_per_s": total_tokens / total_seconds if total_seconds else 0.0,
        "mean_batch_latency_s": sum(latencies) / len(latencies) if latencies else 0.0,
        "stop_rate": stops / max(1, generated * cfg.sampling.n),
        "output": str(out_path),
    }
    _print_samples(out_path)
    lo, hi = wilson_interval(stops, max(1, generated * cfg.sampling.n))
    note = f"{generated * cfg.sampling.n} completions, 95% Wilson; {summary['tokens_per_s']:.0f} tok/s"
    summary["headline"] = format_headline("ended by a stop token", summary["stop_rate"], (lo, hi), note)
    summary["artifacts"] = str(out_path)
    return summary


def _print_samples(path: Path, limit: int = 5) -> None:
    for line in path.read_text().splitlines()[:limit]:
        record = json.loads(line)
        prompt = record.get("prompt") or record["messages"][-1].get("content", "")
        print(f"[{record['index']}] {prompt!r} -> {record['completion']!r}", flush=True)
