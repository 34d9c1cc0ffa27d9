"""The ``mars.mas`` job: multi-agent systems over any LLM backend, the base model beside a trained one.

MARS reports that self-play in games transfers to multi-agent systems
(debate, AutoGen-style) on AIME and GPQA. This harness measures it with three
systems on one question set (`palaestra.mars.mas_benchmarks`):

- ``single``: one agent answers once (agent 0's first-round answer of the debate);
- ``debate``: N agents answer independently, then in each of R-1 further rounds
  every agent sees the others' latest answers and updates its own (Du et al.,
  2023); the final answers are aggregated (``majority``: most common extracted
  answer, ties to the earliest agent; ``first``: agent 0's);
- ``group_chat``: an AutoGen-style two-agent group chat with a fixed speaking
  order: solver, critic, solver, ... for R rounds; the critic sees the whole
  chat and points out mistakes; the final answer is the solver's last one.

Every agent samples with its own seed (``seed*1000 + 100*round + agent``): a
served model honours the seed, and agents with one seed and one prompt would
give one answer. ``trained_llm`` adds a second model run through the same
systems on the same questions; metrics ``mas/<set>/<base|trained>/<system>/accuracy``
(with 95% Wilson bounds) land side by side in one MLflow run.

MARS's own table is another part of the job (``table:``, `palaestra.mars.mas_table`): MASLab's MAD and
AutoGen on the seven benchmarks, scored by equivalence, pass@1 over k samples. ``systems: []`` runs it alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from palaestra.mars.mas_benchmarks import (
    BuiltinSet,
    QuestionStyle,
    accuracy_metrics,
    aggregate,
    builtin_questions,
    extract_answer,
    load_questions,
    question_text,
    same_answer,
)
from palaestra.mars.mas_table import TableConfig, run_table
from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.jobs import job
from palaestra.shared.llm import LLMConfig
from palaestra.shared.tracking import Tracker, scratch_dir


class Aggregation(StrEnum):
    majority = "majority"
    first = "first"


class System(StrEnum):
    single = "single"
    debate = "debate"
    group_chat = "group_chat"


INSTRUCTION = "Think step by step, then give your final answer as <answer>ANSWER</answer>."


@dataclass
class MASConfig(JobConfig):
    """Multi-agent systems (single, debate, group chat) on a question set, for one or two models."""

    job: str = "mars.mas"
    llm: LLMConfig = field(default_factory=LLMConfig)
    """The base model every agent runs."""
    trained_llm: LLMConfig | None = None
    """A trained checkpoint run through the same systems (None: the base model only)."""
    questions_file: str | None = None
    """JSONL with ``question`` and ``answer`` (and ``choices`` for GPQA-style); None: ``builtin``."""
    style: QuestionStyle = QuestionStyle.plain
    """How ``questions_file`` is checked: plain | aime (integer answers) | gpqa (multiple choice)."""
    builtin: BuiltinSet = BuiltinSet.arithmetic
    """The built-in set used without a file: arithmetic | aime_mini | gpqa_mini."""
    num_questions: int = 20
    """Questions to use (the first ones of the file or set; arithmetic generates this many)."""
    systems: list[System] = field(default_factory=lambda: list(System))
    """single | debate | group_chat."""
    num_agents: int = 3
    """Debate agents."""
    rounds: int = 2
    """Debate rounds (1: independent answers, aggregated); group-chat rounds of solver + critic."""
    aggregation: Aggregation = Aggregation.majority
    """Debate aggregation: majority | first."""
    temperature: float = 0.6
    max_tokens: int = 512
    table: TableConfig = field(default_factory=TableConfig)
    """MARS's MAS table: MAD and AutoGen on the seven benchmarks, pass@1 over k samples (`palaestra.mars.mas_table`;
    run when ``table.benchmarks`` is set). ``systems: []`` runs the table alone."""


def debate_prompt(question: str, others: list[str]) -> str:
    shown = "\n\n".join(f"One agent's solution:\n```{o}```" for o in others)
    return (
        f"These are the solutions to the problem from other agents:\n\n{shown}\n\n"
        "Using the reasoning from other agents as additional advice, can you give an updated answer? "
        f"Examine your solution and that of other agents step by step. {INSTRUCTION}"
    )


def _params(cfg: MASConfig, rnd: int, agent: int):
    from palaestra.shared.llm import SamplingParams

    seed = cfg.seed * 1000 + 100 * rnd + agent  # every agent its own sample stream
    return SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=seed)


def run_debate(client, questions: list[dict[str, Any]], cfg: MASConfig) -> list[dict[str, Any]]:
    """Every question debated at once: one batched call per (agent, round), each agent with its own seed."""
    n = cfg.num_agents
    convs = [
        [[{"role": "user", "content": f"{question_text(q)}\n\n{INSTRUCTION}"}] for _ in range(n)] for q in questions
    ]
    history: list[list[list[str]]] = [[[] for _ in range(n)] for _ in questions]
    for rnd in range(cfg.rounds):
        if rnd > 0:
            for qi in range(len(questions)):
                for ai in range(n):
                    others = [history[qi][aj][-1] for aj in range(n) if aj != ai]
                    convs[qi][ai].append({"role": "user", "content": debate_prompt(questions[qi]["question"], others)})
        for ai in range(n):
            texts = [
                c.text for c in client.chat([convs[qi][ai] for qi in range(len(questions))], _params(cfg, rnd, ai))
            ]
            for qi, text in enumerate(texts):
                convs[qi][ai].append({"role": "assistant", "content": text})
                history[qi][ai].append(text)
    records = []
    for qi, q in enumerate(questions):
        first = extract_answer(history[qi][0][0])
        decided = aggregate([extract_answer(history[qi][ai][-1]) for ai in range(n)], cfg.aggregation)
        records.append(
            {
                "question": q["question"],
                "answer": q["answer"],
                "single_answer": first,
                "single_correct": same_answer(first, str(q["answer"])),
                "debate_answer": decided,
                "debate_correct": same_answer(decided, str(q["answer"])),
                "agent_answers": history[qi],
            }
        )
    return records


CRITIC = (
    "You are the critic in a group chat with a solver. Check the solver's latest solution step by step, point out "
    "any mistake, and give the answer you believe is right as <answer>ANSWER</answer>."
)
SOLVER_AGAIN = "The critic replied above. Revise your solution if needed. " + INSTRUCTION


def _chat_view(question: str, turns: list[tuple[str, str]], me: str) -> list[dict]:
    """The group chat as agent `me` sees it: its own turns as assistant, the other's as user messages."""
    messages = [{"role": "user", "content": f"{question}\n\n{INSTRUCTION if me == 'solver' else CRITIC}"}]
    for speaker, text in turns:
        if speaker == me:
            messages.append({"role": "assistant", "content": text})
        else:
            follow = SOLVER_AGAIN if me == "solver" else CRITIC
            messages.append({"role": "user", "content": f"[{speaker}]: {text}\n\n{follow}"})
    return messages


def run_group_chat(client, questions: list[dict[str, Any]], cfg: MASConfig) -> list[dict[str, Any]]:
    """AutoGen-style group chat, fixed speaking order solver -> critic per round; the solver's last answer counts."""
    chats: list[list[tuple[str, str]]] = [[] for _ in questions]
    texts = [question_text(q) for q in questions]
    for rnd in range(cfg.rounds):
        for agent, speaker in enumerate(("solver", "critic")):
            if speaker == "critic" and rnd == cfg.rounds - 1:
                break  # the chat ends on the solver's turn
            views = [_chat_view(texts[qi], chats[qi], speaker) for qi in range(len(questions))]
            for qi, c in enumerate(client.chat(views, _params(cfg, rnd, agent))):
                chats[qi].append((speaker, c.text))
    records = []
    for q, chat in zip(questions, chats):
        final = extract_answer([t for s, t in chat if s == "solver"][-1])
        records.append(
            {
                "question": q["question"],
                "answer": q["answer"],
                "group_chat_answer": final,
                "group_chat_correct": same_answer(final, str(q["answer"])),
                "chat": chat,
            }
        )
    return records


def run_systems(client, questions: list[dict[str, Any]], cfg: MASConfig) -> dict[str, list[dict[str, Any]]]:
    """``{system: records}`` for the configured systems (single comes from the debate's first round)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if "debate" in cfg.systems or "single" in cfg.systems:
        debate = run_debate(client, questions, cfg)
        for system in ("single", "debate"):
            if system in cfg.systems:
                out[system] = [{**r, "correct": r[f"{system}_correct"]} for r in debate]
    if "group_chat" in cfg.systems:
        out["group_chat"] = [{**r, "correct": r["group_chat_correct"]} for r in run_group_chat(client, questions, cfg)]
    return out


def _check(cfg: MASConfig) -> None:
    if cfg.aggregation not in list(Aggregation):
        raise ConfigError(f"aggregation: unknown rule {cfg.aggregation!r}; known: {', '.join(Aggregation)}")
    if cfg.num_agents < 1 or cfg.rounds < 1:
        raise ConfigError("num_agents and rounds must be at least 1")
    for system in cfg.systems:
        if system not in list(System):
            raise ConfigError(f"systems: unknown system {system!r}; known: {', '.join(System)}")
    if cfg.style not in list(QuestionStyle):
        raise ConfigError(f"style: unknown style {cfg.style!r}; known: {', '.join(QuestionStyle)}")
    if not cfg.systems and not cfg.table.benchmarks:
        raise ConfigError("nothing to run: systems is empty and table.benchmarks is not set")


@job("mars.mas", MASConfig)
def mas_job(cfg: MASConfig, tracker: Tracker) -> dict:
    """Single agent, debate and group chat on a question set; the base model beside a trained checkpoint."""
    from palaestra.shared.llm import make_client

    _check(cfg)
    if cfg.questions_file:
        questions = load_questions(cfg.questions_file, cfg.num_questions, cfg.style)
        dataset = Path(cfg.questions_file).stem
    else:
        questions, dataset = builtin_questions(cfg.builtin, cfg.num_questions, cfg.seed), cfg.builtin
    models = [("base", cfg.llm)] + ([("trained", cfg.trained_llm)] if cfg.trained_llm is not None else [])
    metrics: dict[str, float] = {f"mas/{dataset}/questions": float(len(questions))} if cfg.systems else {}
    transcripts = []
    for tag, llm in models:
        client = make_client(llm)
        for system, records in (run_systems(client, questions, cfg) if cfg.systems else {}).items():
            metrics.update(accuracy_metrics([r["correct"] for r in records], f"mas/{dataset}/{tag}/{system}"))
            transcripts += [{"model": tag, "system": system, **r} for r in records]
            key = f"mas/{dataset}/{tag}/{system}/accuracy"
            print(f"{dataset} {tag:>7} {system:>10}: {metrics[key]:.3f}", flush=True)
        if cfg.table.benchmarks:  # MARS's table: MAD and AutoGen on the benchmarks
            table_metrics, table_records = run_table(client, cfg.table, cfg.seed, tag)
            metrics.update(table_metrics)
            transcripts += table_records
        client.close()
    tracker.log_metrics(metrics)
    out = scratch_dir() / "mas_transcripts.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in transcripts))
    tracker.log_artifact(out)
    keep = ("/accuracy", "/pass_at_1", "/pass_at_1_lo", "/pass_at_1_hi")
    return {k.removeprefix(f"mas/{dataset}/").removeprefix("mas/"): v for k, v in metrics.items() if k.endswith(keep)}
