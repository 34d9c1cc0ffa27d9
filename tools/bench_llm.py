"""Benchmark: generated tokens/s of `LLMClient` (transformers backend) vs calling `model.generate` directly.

Same model object, same prompts (chat-rendered), same batch, greedy decoding, measured in the same run with the
two paths interleaved, ``--repeats`` times (at least 5). Prints tokens/s as median [min-max] over the repeats, the
ratio client / direct of the medians (goal: >= 0.95) by wall-clock time and by this process's CPU time (on a
machine shared with other jobs, CPU time is the steadier measure of the client's own overhead), and the batch-16 vs
batch-1 speedup of the client.

    .venv/bin/python tools/bench_llm.py                      # tiny and smollm2-135m
    .venv/bin/python tools/bench_llm.py --models tiny --max-tokens 64
"""

from __future__ import annotations

import argparse
import time

import torch
from benchstats import REPEATS, median, spread

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?",
    "Give a synonym for happy.",
    "Which planet is known as the red planet?",
    "Translate 'good morning' into Spanish.",
    "What does CPU stand for?",
    "Who wrote Romeo and Juliet?",
    "What is the square root of 81?",
    "Name a mammal that can fly.",
    "What color is the sky on a clear day?",
    "How many days are in a leap year?",
    "What is the largest ocean on Earth?",
]


def direct_generate(model, tokenizer, prompts: list[list[int]], max_tokens: int) -> int:
    """The baseline: one left-padded `model.generate` call; returns the number of generated tokens."""
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt", padding_side="left")
    with torch.inference_mode():
        out = model.generate(
            **batch.to(model.device), max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    generated = out[:, batch["input_ids"].shape[1] :]
    eos = set(model.generation_config.eos_token_id or [])
    count = 0
    for row in generated.tolist():  # up to and including the first end-of-turn token, as the client counts
        end = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
        count += end
    return count


def timed(fn) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, generated tokens) of one call."""
    start, cpu = time.perf_counter(), time.process_time()
    tokens = fn()
    return time.perf_counter() - start, time.process_time() - cpu, tokens


def bench_model(name: str, batch: int, max_tokens: int, repeats: int) -> dict:
    client = make_client(LLMConfig(model=name, device="cpu", max_batch_size=batch))
    prompts = [client.render([{"role": "user", "content": q}]) for q in (QUESTIONS * 4)[:batch]]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    via_client = lambda: sum(len(c.token_ids) for c in client.generate(prompts, params))
    via_direct = lambda: direct_generate(client.model, client.tokenizer, prompts, max_tokens)
    via_client(), via_direct()  # warm-up
    client_runs, direct_runs = [], []
    for _ in range(repeats):
        client_runs.append(timed(via_client))
        direct_runs.append(timed(via_direct))
    rates = lambda runs: [tokens / wall for wall, _, tokens in runs]
    cpu_rates = lambda runs: [tokens / cpu for _, cpu, tokens in runs]
    client.config.max_batch_size = 1
    single = [timed(via_client) for _ in range(repeats)]
    return {
        "model": name,
        "tokens": client_runs[0][2],
        "direct_tok_s": rates(direct_runs),
        "client_tok_s": rates(client_runs),
        "ratio": median(rates(client_runs)) / median(rates(direct_runs)),
        "cpu_ratio": median(cpu_rates(client_runs)) / median(cpu_rates(direct_runs)),
        "batch1_tok_s": rates(single),
        "batch_speedup": median(rates(client_runs)) / median(rates(single)),
        "cpu_batch_speedup": median(cpu_rates(client_runs)) / median(cpu_rates(single)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"greedy, batch {args.batch}, max_tokens {args.max_tokens}, {args.threads} thread(s)")
    print(f"tok/s: median [min-max] of {args.repeats} runs; ratios of the medians")
    header = f"{'model':<14}{'tokens':>8}{'direct tok/s':>20}{'client tok/s':>20}{'ratio':>8}{'cpu ratio':>11}"
    print(header + f"{'batch-1 tok/s':>20}{f'b{args.batch}/b1':>9}{'cpu b/b1':>10}")
    for name in args.models:
        r = bench_model(name, args.batch, args.max_tokens, args.repeats)
        print(
            f"{r['model']:<14}{r['tokens']:>8}{spread(r['direct_tok_s']):>20}{spread(r['client_tok_s']):>20}"
            f"{r['ratio']:>8.3f}{r['cpu_ratio']:>11.3f}{spread(r['batch1_tok_s']):>20}{r['batch_speedup']:>9.2f}"
            f"{r['cpu_batch_speedup']:>10.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
