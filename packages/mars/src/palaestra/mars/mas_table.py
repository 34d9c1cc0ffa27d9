"""MARS's multi-agent-system table: MAD and AutoGen on the seven benchmarks, pass@1 over k samples per question.

``mars.mas`` runs it when ``table.benchmarks`` is set (`TableConfig`): for each model (base, then trained),
each benchmark (`palaestra.mars.mas_data`) and each system (`palaestra.mars.mas_systems`), k passes over the
questions, pass j sampling with seed ``seed * 1000 + j`` and, for multiple choice, the choices in that pass's
order (`shuffle_choices`). Each final answer is scored (`palaestra.mars.mas_scoring`). Metrics:
``mas/<benchmark>/<base|trained>/<system>/pass_at_1`` (pass@1; MLflow names allow no ``@``) with ``_lo``/``_hi``
(95% t interval over questions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from palaestra.mars.mas_data import Benchmark, load_benchmark, question_prompt, shuffle_choices
from palaestra.mars.mas_scoring import is_correct, pass_at_1
from palaestra.mars.mas_systems import run_autogen, run_mad, run_single
from palaestra.shared.config import ConfigError


class TableSystem(StrEnum):
    single = "single"
    mad = "mad"
    autogen = "autogen"


@dataclass
class BenchmarkSpec:
    name: Benchmark = Benchmark.gsm8k
    """gsm8k | math500 | aqua | aime24 | amc23 | gpqa_diamond | mmlu_stem."""
    path: str = ""
    """The local copy of the official release (a file or a folder; see `palaestra.mars.mas_data`)."""
    limit: int = 0
    """The first questions only (0: all)."""
    samples: int = 0
    """k for this benchmark (0: ``table.samples``): small sets (AIME's 30) need more samples per question."""


@dataclass
class TableConfig:
    """MARS's MAS table (empty ``benchmarks``: not run)."""

    benchmarks: list[BenchmarkSpec] = field(default_factory=list)
    systems: list[TableSystem] = field(default_factory=lambda: [TableSystem.mad, TableSystem.autogen])
    """single (the model alone) | mad | autogen."""
    samples: int = 1
    """k: samples per question; pass_at_1 is averaged over them."""
    mad_rounds: int = 3
    """MAD's most rounds (MASLab: 3); the moderator may stop it sooner."""
    autogen_turns: int = 3
    """AutoGen's most assistant replies (MASLab's max_turn: 3); TERMINATE ends it sooner."""
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    max_tokens: int = 32768
    """Per reply. The defaults are Qwen3's card for thinking mode (T 0.6, top_p 0.95, top_k 20, 32,768 tokens)."""

    def __post_init__(self) -> None:
        check_table(self)  # when the config resolves, so --dry-run catches it


def check_table(table: TableConfig) -> None:
    for spec in table.benchmarks:
        if spec.name not in list(Benchmark):
            raise ConfigError(f"table.benchmarks: unknown benchmark {spec.name!r}; known: {', '.join(Benchmark)}")
        if not spec.path:
            raise ConfigError(f"table.benchmarks: {spec.name} needs a path (a local copy of its official release)")
    for system in table.systems:
        if system not in list(TableSystem):
            raise ConfigError(f"table.systems: unknown system {system!r}; known: {', '.join(TableSystem)}")
    if (
        table.samples < 1
        or any(spec.samples < 0 for spec in table.benchmarks)
        or table.mad_rounds < 1
        or table.autogen_turns < 1
        or table.max_tokens < 1
    ):
        raise ConfigError("table: samples, mad_rounds, autogen_turns and max_tokens must be at least 1")


def _params(table: TableConfig, seed: int):
    from palaestra.shared.llm import SamplingParams

    def params(call: int) -> SamplingParams:
        return SamplingParams(
            temperature=table.temperature,
            top_p=table.top_p,
            top_k=table.top_k,
            max_tokens=table.max_tokens,
            seed=seed * 1000 + call,
        )

    return params


def _system(client, system: str, prompts: list[str], table: TableConfig, seed: int) -> list[dict[str, Any]]:
    params = _params(table, seed)
    if system == TableSystem.mad:
        return run_mad(client, prompts, params, table.mad_rounds)
    if system == TableSystem.autogen:
        return run_autogen(client, prompts, params, table.autogen_turns)
    return run_single(client, prompts, params)


def run_table(client, table: TableConfig, seed: int, tag: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Every benchmark x system for one model (`tag`: base | trained): metrics and one record per answer."""
    metrics: dict[str, float] = {}
    records: list[dict[str, Any]] = []
    for spec in table.benchmarks:
        rows = load_benchmark(spec.name, spec.path, spec.limit)
        for system in table.systems:
            correct: list[list[bool]] = [[] for _ in rows]
            for k in range(spec.samples or table.samples):
                sample_seed = seed * 1000 + k
                asked = [shuffle_choices(r, sample_seed) for r in rows]
                results = _system(client, system, [question_prompt(r) for r in asked], table, sample_seed)
                for q, (row, result) in enumerate(zip(asked, results)):
                    right = is_correct(row, result["response"])
                    correct[q].append(right)
                    where = {"model": tag, "benchmark": str(spec.name), "system": str(system), "sample": k}
                    records.append({**where, "id": row["id"], "answer": row["answer"], "correct": right, **result})
            prefix = f"mas/{spec.name}/{tag}/{system}"
            metrics.update({f"{prefix}/{key}": value for key, value in pass_at_1(correct).items()})
            print(f"{spec.name} {tag:>7} {system:>8}: pass_at_1 {metrics[f'{prefix}/pass_at_1']:.3f}", flush=True)
    return metrics, records
