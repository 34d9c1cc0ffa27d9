"""Benchmark datagen: verified samples/minute of the deterministic pipeline on 1 vs 2 Ray workers
(printing the scaling ratio), and LLM calls per kept sample of the LLM pipeline: every role on the tiny
model (random weights: all drops, a check of the accounting), the reasoner and critic only, and a real
pretrained model (smollm2-135m) as query writer with deterministic other roles.

    .venv/bin/python tools/bench_datagen.py [--samples 320] [--repeats 5] [--llm-samples 6] [--llm-model tiny]

The graph is mined once and shared; each measurement writes into a fresh temp dir. Rates are the median
[min-max] of ``--repeats`` runs (1 and 2 workers interleaved); the LLM-call counts come from one run each.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from benchstats import REPEATS, median, spread

from palaestra.datagen.generate import DataGenerationConfig, build_graph, run_generation
from palaestra.datagen.pipeline import ItemConfig, RolesConfig
from palaestra.shared import cluster
from palaestra.shared.config import ClusterConfig, TrackingConfig
from palaestra.shared.llm.base import LLMConfig, SamplingParams
from palaestra.shared.tracking import Tracker


def measure(graph, workers: int, samples: int, **kw) -> tuple[float, object]:
    cfg = DataGenerationConfig(
        num_samples=samples,
        workers=workers,
        items_per_task=max(4, samples // 16),
        output_dir=tempfile.mkdtemp(),
        tracking=TrackingConfig(enabled=False),
        **kw,
    )
    start = time.perf_counter()
    stats = run_generation(cfg, graph, Tracker(cfg.tracking))
    return stats.kept / ((time.perf_counter() - start) / 60), stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=320)
    ap.add_argument("--llm-samples", type=int, default=6)
    ap.add_argument("--llm-model", default="tiny")
    ap.add_argument("--writer-model", default="smollm2-135m", help="query-writer-only run ('' to skip)")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args()
    cluster.init(ClusterConfig(num_cpus=2, object_store_mb=128))
    graph = build_graph(DataGenerationConfig().envs)
    measure(graph, 2, 32)  # start both workers and warm their imports before timing
    one, two = [], []
    for _ in range(args.repeats):
        one.append(measure(graph, 1, args.samples)[0])
        two.append(measure(graph, 2, args.samples)[0])
    ratios = [b / a for a, b in zip(one, two)]
    print(
        f"deterministic pipeline, verified samples/min, median [min-max] of {args.repeats}: 1 worker {spread(one)}, "
        f"2 workers {spread(two)} -> scaling ratio {spread(ratios, '.2f')} (of medians {median(two) / median(one):.2f})"
    )
    roles = RolesConfig(
        tool_maker="llm",
        query_writer="llm",
        reasoner="llm",
        critic="llm",
        llm=LLMConfig(model=args.llm_model, device="cpu"),
        sampling=SamplingParams(temperature=1.0, max_tokens=48),
    )
    rate, stats = measure(
        graph,
        0,
        args.llm_samples,
        roles=roles,
        envs=["MathAPI", "VehicleControlAPI"],
        item=ItemConfig(k_max=2, max_steps=3, max_turns=1),
    )
    report = stats.report()
    print(
        f"LLM pipeline ({args.llm_model}): {stats.llm_calls} LLM calls, {stats.kept} kept of "
        f"{args.llm_samples}, LLM calls per kept sample {report['llm_calls_per_kept_sample']:.1f} "
        f"(with none kept: the total), drops {stats.drops}"
    )
    hybrid = RolesConfig(reasoner="llm", critic="llm", llm=roles.llm, sampling=roles.sampling)
    _, hstats = measure(
        graph, 0, args.llm_samples, roles=hybrid, envs=["MathAPI"], item=ItemConfig(k_max=2, max_steps=3, max_turns=1)
    )
    print(
        f"LLM reasoner+critic only ({args.llm_model}): {hstats.llm_calls} LLM calls, {hstats.kept} kept, "
        f"drops {hstats.drops}"
    )
    if args.writer_model:
        writer = RolesConfig(
            query_writer="llm",
            llm=LLMConfig(model=args.writer_model, device="cpu"),
            sampling=SamplingParams(temperature=0.7, max_tokens=80, seed=0),
        )
        _, wstats = measure(
            graph,
            0,
            args.llm_samples,
            roles=writer,
            envs=["MathAPI", "VehicleControlAPI"],
            item=ItemConfig(max_turns=1),
        )
        per = wstats.llm_calls / wstats.kept if wstats.kept else float("nan")
        print(
            f"LLM query writer ({args.writer_model}) + deterministic roles: {wstats.llm_calls} LLM calls, "
            f"{wstats.kept} kept -> {per:.2f} LLM calls per kept sample, drops {wstats.drops}"
        )


if __name__ == "__main__":
    main()
