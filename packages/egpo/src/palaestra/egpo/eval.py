"""BFCL evaluation (job ``egpo.eval``): any LLM backend, our prompt format, BFCL's official checkers.

Per category, every entry becomes an environment whose ``step`` decodes the response and scores it:

- single-turn AST categories: decoded calls -> BFCL's ``ast_checker`` (`BFCLSingleTurnEnv`);
- ``irrelevance`` / ``live_irrelevance`` / ``live_relevance``: BFCL's rule (a decoded call or not);
- multi-turn categories: `BFCLMultiTurnEnv` (calls executed, BFCL's ``multi_turn_checker``).

The model plays them through the shared rollout engine (batched across entries). A ``policy`` other
than ``model`` replaces the model by an oracle that answers with each entry's ground truth
(``ground_truth``) or with a deliberately wrong answer (``wrong``): the harness check, through the
same decode-and-score path. Logged: ``bfcl/<category>/accuracy`` (with its 95% Wilson interval,
``ci95_low`` / ``ci95_high``), summary scores, and a JSONL
artifact per category with every sample's output, decoded calls and verdict.

Summary scores: BFCL v4's own formula (`palaestra.egpo.bfcl_results.bfcl_summary`: weighted groups,
live without live_relevance, categories that did not run count 0 as in BFCL), logged as
``bfcl/summary/{overall,non_live,live,irrelevance,multi_turn,agentic,relevance}``, and BFCL v3's (the papers'
figures: `bfcl_v3_summary`) as ``bfcl/summary_v3/{overall,non_live,live,multi_turn,single_turn,...}``; the
printed line names the version of each figure and the offline maximum of each overall. BFCL's result files
(each raw response as BFCL's runner stores it), score files and ``data_overall.csv`` go to ``<output_dir>/bfcl/``
(and MLflow), so that ``bfcl evaluate`` re-scores a run from what the model wrote. ``decoder``: ``palaestra``
(our parser, then BFCL's checkers) or ``bfcl`` (BFCL's handler of ``bfcl_model`` and BFCL's runner,
`palaestra.egpo.bfcl_handler`); ``prompt``: ``palaestra`` (our system prompt), ``bfcl_fc`` (BFCL's FC mode: the
entry's messages, its function docs as tools) or ``bfcl_prompting`` (BFCL's prompting mode: the handler's system
prompt, no tools); all are tagged on the run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from palaestra.egpo import bfcl, bfcl_handler
from palaestra.egpo.bfcl_results import (
    BFCL_V3_VERSION,
    BFCL_VERSION,
    bfcl_summary,
    bfcl_v3_summary,
    decode_calls,
    offline_maximum,
    write_run_files,
)
from palaestra.egpo.multiturn import BFCLMultiTurnEnv, ground_truth_turn_calls
from palaestra.egpo.reward import judge_completion
from palaestra.egpo.tasks import FCTask, canonical_calls, load_bfcl
from palaestra.shared.config import ConfigError, JobConfig
from palaestra.shared.jobs import format_headline, job
from palaestra.shared.llm.base import LLMConfig
from palaestra.shared.rollout.chat_tokens import ContextView
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.stats import wilson_interval
from palaestra.shared.toolcall import ToolCall, format_calls
from palaestra.shared.tracking import Tracker

DEFAULT_CATEGORIES = list(bfcl.ALL_CATEGORIES)
"""Every BFCL category that runs offline in our format (see `palaestra.egpo.bfcl`)."""
WHOLE_CONTEXT = 1 << 30  # max_context_tokens for "the model's whole context" (the engine keeps to the model's own)


class EvalPolicy(StrEnum):
    """What answers: the model, or an oracle that checks the harness (ground truth, or a wrong answer)."""

    model = "model"
    ground_truth = "ground_truth"
    wrong = "wrong"


class Decoder(StrEnum):
    """How a response becomes calls (`DECODERS`)."""

    palaestra = "palaestra"
    bfcl = "bfcl"


class PromptFormat(StrEnum):
    """How tasks are put to the model (see the module docstring)."""

    palaestra = "palaestra"
    bfcl_fc = "bfcl_fc"
    bfcl_prompting = "bfcl_prompting"


@dataclass
class BfclEvalConfig(JobConfig):
    """Evaluate a model on BFCL categories with the official checkers."""

    llm: LLMConfig = field(default_factory=LLMConfig)
    """The model under evaluation (any backend)."""
    categories: list[str] = field(default_factory=lambda: list(DEFAULT_CATEGORIES))
    """BFCL v4 categories (see palaestra.egpo.bfcl for what runs offline)."""
    limit: int | None = None
    """Entries per category (None: all)."""
    limits: dict[str, int] = field(default_factory=dict)
    """Entries of the categories named here (instead of ``limit``): the first N in BFCL's order."""
    policy: EvalPolicy = EvalPolicy.model
    """model | ground_truth | wrong (the last two: the harness check, with an oracle instead of the model)."""
    temperature: float = 0.0  # 0: greedy
    max_tokens_per_turn: int = 1024  # generated tokens per model response
    max_context_tokens: int | None = 16384
    """Prompt + response tokens per conversation; None: the model's whole context, as BFCL's runner gives it (with
    ``max_tokens_per_turn: 4096``: BFCL's budget, min(4096, context - prompt))."""
    max_model_calls: int = 60
    """Model responses per multi-turn episode (all turns together); more truncates it (scored wrong)."""
    top_p: float = 1.0  # BFCL's runner leaves it at the server's default, 1.0
    context: ContextView = ContextView.template
    """A multi-turn entry's later prompts: ``template`` (BFCL's runner: the conversation re-rendered through the
    model's template every turn) | ``generated`` (the tokens sampled so far, as training sees them)."""
    decoder: Decoder = Decoder.palaestra
    """palaestra (our parser, then BFCL's checkers) | bfcl (BFCL's handler of ``bfcl_model`` and its runner)."""
    prompt: PromptFormat = PromptFormat.palaestra
    """palaestra (our system prompt) | bfcl_fc (BFCL's FC-mode messages) | bfcl_prompting (BFCL's prompting mode)."""
    bfcl_model: str = bfcl_handler.DEFAULT_MODEL
    """The BFCL model key whose handler decodes, prompts and names the result files (``...-FC``: FC mode)."""
    write_bfcl_files: bool = True
    """Write BFCL's result / score files and score CSV under ``<output_dir>/bfcl``."""


class BFCLSingleTurnEnv(TextEnv):
    """One BFCL single-turn entry: one response, decoded and scored by BFCL's checker."""

    agents = ["agent"]

    def __init__(
        self,
        task: FCTask,
        decoder: str = "palaestra",
        prompt: str = "palaestra",
        bfcl_model: str = bfcl_handler.DEFAULT_MODEL,
    ):
        self.task = task
        self.decoder, self.prompt, self.bfcl_model = decoder, prompt, bfcl_model
        self.env_type = f"bfcl_{task.category}"

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self._observed = False
        return {"id": self.task.id}

    def observe(self, agent: str) -> list[dict]:
        if self._observed:
            return []
        self._observed = True
        if self.prompt == "bfcl_prompting":
            return bfcl_handler.first_turn_messages(self.bfcl_model, self.task.id, self.task.messages, self.task.tools)
        return list(self.task.messages) if self.prompt == "bfcl_fc" else self.task.prompt_messages()

    def tools(self, agent: str) -> list[dict] | None:
        if self.prompt == "bfcl_prompting":
            return None  # BFCL's prompting mode: the function docs are in its system prompt
        return list(self.task.tools) if self.prompt == "bfcl_fc" else self.task.chat_tools()

    def step(self, action: str) -> Step:
        verdict = score_single_turn(self.task, action, self.decoder, self.bfcl_model)
        return Step(rewards={"agent": 1.0 if verdict["valid"] else 0.0}, terminated=True, info=verdict)


def score_single_turn(
    task: FCTask, text: str, decoder: str = "palaestra", bfcl_model: str = bfcl_handler.DEFAULT_MODEL
) -> dict[str, Any]:
    """Decode and score `text`: our parser then BFCL's checkers (``palaestra``), or BFCL's handler of `bfcl_model`
    and BFCL's runner on the response as BFCL stores it (``bfcl``: `palaestra.egpo.bfcl_handler`)."""
    out: dict[str, Any]
    if decoder == "bfcl":
        stored = bfcl_handler.stored_response(bfcl_model, text)
        verdict = bfcl_handler.score_single_turn(
            bfcl_model, task.id, task.category, stored, task.tools, task.ground_truth
        )
        out = {"decoded": verdict["decoded"], "decode_error": verdict["error"], "valid": verdict["valid"]}
        out["error"] = verdict["error_type"]
    else:
        calls, error = decode_calls(text, decoder)
        decoded = None if calls is None else [{c.name: c.arguments} for c in calls]
        out = {"decoded": decoded, "decode_error": error}
        if bfcl.category_kind(task.category) == "relevance":
            out["valid"] = bfcl.official_relevance_check(decoded, task.category)
            out["error"] = None if out["valid"] else "relevance rule"
        elif decoded is None:
            out["valid"], out["error"] = False, f"ast_decoder:decoder_failed ({error})"
        else:
            result = bfcl.official_ast_check(task.tools, copy.deepcopy(decoded), task.ground_truth, task.category)
            out["valid"], out["error"] = bool(result["valid"]), result.get("error_type")
    # our training reward's verdict on the same text (format without <think> required, as the eval is)
    out["fc_binary"] = float(judge_completion(task, text, require_think=False)[0])
    return out


# ---- oracles for the harness check -----------------------------------------------------------


def oracle_answer(env: TextEnv, wrong: bool) -> str:
    """The next response of the ground-truth (or wrong) oracle for `env`."""
    if isinstance(env, BFCLSingleTurnEnv):
        calls = canonical_calls(env.task.ground_truth, env.task.tools)
        if env.task.category == "live_relevance":  # BFCL has no ground truth here: any call is right
            calls = [{"name": env.task.tools[0]["name"], "arguments": {}}]
            if wrong:
                calls = []
        elif wrong:  # a call where none is due, or a misnamed call
            calls = (
                [{"name": calls[0]["name"] + "_x", "arguments": calls[0]["arguments"]}]
                if calls
                else [{"name": env.task.tools[0]["name"] if env.task.tools else "f", "arguments": {}}]
            )
        if not calls:
            return "<think>No function fits.</think>I cannot do that with the functions I have."
        return format_calls([ToolCall(c["name"], c["arguments"]) for c in calls], thinking="Calling the tools.")
    assert isinstance(env, BFCLMultiTurnEnv), type(env).__name__
    turn_calls = env.oracle_calls[env.turn]
    first_due = next((i for i, calls in enumerate(env.oracle_calls) if calls), None)
    if env.steps_in_turn == 0 and turn_calls and not (wrong and env.turn == first_due):  # wrong: skip a due turn
        return format_calls([ToolCall(n, a) for n, a in turn_calls], thinking="Calling the tools.")
    return "<think>The request is handled.</think>Done."


def run_oracle(envs: list[TextEnv], wrong: bool) -> list[dict]:
    out = []
    for env in envs:
        env.reset(0)
        texts, step = [], Step()
        for _ in range(200):
            env.observe("agent")
            texts.append(oracle_answer(env, wrong))
            step = env.step(texts[-1])
            if step.done:
                break
        out.append({"outputs": texts, "reward": sum(step.rewards.values()), "info": step.info, "limit": None})
    return out


def run_model(envs: list[TextEnv], client: Any, cfg: BfclEvalConfig, rollouts: Any = None) -> list[dict]:
    """Play every entry once with `client` in this process, or on `rollouts` (the trainer's `eval_rollouts`: its
    workers, backend and synced weights; an env played on a Ray worker comes back as its trajectory, and a
    multi-turn entry's per-turn responses in its final info)."""
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig
    from palaestra.shared.rollout.workers import LocalRollouts

    # a conversation longer than the model's context is cut, never sent: the engine keeps to min(max_context_tokens,
    # the model's context); None leaves only the model's context (BFCL's runner gives the model all of it)
    settings = RolloutConfig(
        group_size=1,
        max_turns=cfg.max_model_calls,
        max_tokens_per_turn=cfg.max_tokens_per_turn,
        max_context_tokens=cfg.max_context_tokens or WHOLE_CONTEXT,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        context=cfg.context,
    )
    rollouts = rollouts if rollouts is not None else LocalRollouts(client, settings)
    specs = [EpisodeSpec(make_env=_returning(env), seed=cfg.seed, group_id=str(i)) for i, env in enumerate(envs)]
    result = rollouts.run(specs, cfg.seed, settings)
    by_group = {t.group_id: t for t in result.trajectories}
    out = []
    for i, env in enumerate(envs):
        traj = by_group.get(str(i))
        if isinstance(env, BFCLMultiTurnEnv):
            env.close()  # an episode cut by a limit never reached its end
        if traj is None:
            out.append({"outputs": [], "reward": 0.0, "info": {"error": "no trajectory"}, "limit": "none"})
            continue
        final = traj.info.get("final") or {}
        reward = sum(t.reward for t in traj.turns) if traj.terminated and not traj.failed else 0.0
        limit = traj.limit if not traj.terminated else None
        info = final if traj.terminated else {"error": traj.error or f"truncated ({traj.limit})"}
        outputs = [t.text for t in traj.turns]
        if isinstance(env, BFCLSingleTurnEnv) and traj.limit == "context" and outputs and not traj.failed:
            # BFCL scores a response cut at the end of the context as it came back
            info = score_single_turn(env.task, outputs[-1], env.decoder, env.bfcl_model)
            reward = 1.0 if info["valid"] else 0.0
        # per user turn: the env's own record (in this process, or in the final info from a worker); one list
        # when the episode was cut on a worker before its end
        turns = getattr(env, "responses", None) or final.get("responses") or [outputs]
        out.append({"outputs": outputs, "reward": reward, "info": info, "limit": limit, "turn_outputs": turns})
    return out


def _returning(env: TextEnv) -> Callable[[], TextEnv]:  # a typed make_env
    return lambda: env


def build_envs(
    category: str,
    limit: int | None,
    decoder: str = "palaestra",
    prompt: str = "palaestra",
    bfcl_model: str = bfcl_handler.DEFAULT_MODEL,
) -> tuple[list[TextEnv], list[str]]:
    if bfcl.category_kind(category) == "multi_turn":
        envs: list[TextEnv] = []
        ids = []
        for entry, truth in bfcl.load_category(category, limit):
            env = BFCLMultiTurnEnv(entry, truth or [], decoder=decoder, prompt=prompt, bfcl_model=bfcl_model)
            env.oracle_calls = ground_truth_turn_calls(entry, truth or [])
            envs.append(env)
            ids.append(entry["id"])
        return envs, ids
    tasks = load_bfcl(category, limit)
    return [BFCLSingleTurnEnv(t, decoder, prompt, bfcl_model) for t in tasks], [t.id for t in tasks]


@job("egpo.eval", BfclEvalConfig)
def evaluate(cfg: BfclEvalConfig, tracker: Tracker) -> dict:
    """BFCL evaluation of any LLM backend in our prompt format, scored by BFCL's official checkers."""
    check_bfcl_settings(cfg)
    skipped = sorted(bfcl.OFFLINE_SKIPPED)
    print(f"egpo.eval: not run offline / outside our format: {', '.join(skipped)}", flush=True)
    tracker.set_tags({"bfcl.skipped_categories": ",".join(skipped)})
    client = None
    if cfg.policy == "model":
        from palaestra.shared.llm.base import make_client

        client = make_client(cfg.llm)
    try:
        return evaluate_with_client(cfg, client, tracker)
    finally:
        if client is not None:
            client.close()


def check_bfcl_settings(cfg: Any) -> None:
    """`bfcl_handler.check_settings` of a config (this job's or ``egpo.train``'s ``eval``) as a ConfigError."""
    try:
        bfcl_handler.check_settings(cfg.categories, cfg.bfcl_model, cfg.prompt, cfg.decoder)
    except (ValueError, ImportError) as err:
        raise ConfigError(str(err)) from None


def evaluate_with_client(cfg: BfclEvalConfig, client: Any, tracker: Tracker, rollouts: Any = None) -> dict:
    """Run and score every category with `client` (None: the oracle of ``cfg.policy``), on `rollouts` when given
    (the trainer's: its workers and synced weights); log to `tracker`."""
    versions = {"bfcl.version": BFCL_VERSION, "bfcl.version_v3": BFCL_V3_VERSION}  # bfcl/summary/*, summary_v3/*
    settings = {f"bfcl.{k}": getattr(cfg, k) for k in ("decoder", "prompt", "context")}
    tracker.set_tags({**versions, **settings, "bfcl.model": cfg.bfcl_model})
    accuracy, scores, by_category = {}, {}, {}
    for category in cfg.categories:
        limit = cfg.limits.get(category, cfg.limit)
        envs, ids = build_envs(category, limit, cfg.decoder, cfg.prompt, cfg.bfcl_model)
        if client is None:
            results = run_oracle(envs, wrong=cfg.policy == "wrong")
        else:
            results = run_model(envs, client, cfg, rollouts)
        records = [{"id": i, "category": category, **_record(r)} for i, r in zip(ids, results)]
        for record, result, env in zip(records, results, envs):
            if isinstance(env, BFCLMultiTurnEnv):
                record["turn_outputs"] = result.get("turn_outputs") or getattr(env, "responses", [[]])
        by_category[category] = records
        correct = sum(r["valid"] for r in records)
        accuracy[category], scores[category] = correct / max(len(records), 1), (correct, len(records))
        low, high = wilson_interval(correct, len(records))
        tracker.log_metrics(
            {
                f"bfcl/{category}/accuracy": accuracy[category],
                f"bfcl/{category}/n": len(records),
                f"bfcl/{category}/ci95_low": low,
                f"bfcl/{category}/ci95_high": high,
            }
        )
        tracker.log_text("\n".join(json.dumps(r, default=str) for r in records) + "\n", f"bfcl/{category}.jsonl")
        interval = f"95% CI [{low:.2%}, {high:.2%}]"
        print(f"egpo.eval: {category}: {correct}/{len(records)} = {accuracy[category]:.2%} {interval}", flush=True)
    summary = {f"bfcl/summary/{k}": v for k, v in bfcl_summary(scores).items() if k != "non_live_simple"}
    summary.update({f"bfcl/summary_v3/{k}": v for k, v in bfcl_v3_summary(scores).items()})
    tracker.log_metrics(summary)
    not_run = [c for c in DEFAULT_CATEGORIES if c not in scores]
    v3 = {k.rsplit("/", 1)[1]: v for k, v in summary.items() if k.startswith("bfcl/summary_v3/")}
    print(
        f"egpo.eval: {BFCL_VERSION} overall {summary['bfcl/summary/overall']:.2%} (offline maximum "
        f"{offline_maximum('v4'):.2%}: the agentic 40% cannot run here) | {BFCL_V3_VERSION} overall {v3['overall']:.2%}"
        f" (offline maximum {offline_maximum('v3'):.2%}), multi-turn {v3['multi_turn']:.2%}, single-turn "
        f"{v3['single_turn']:.2%} | decoder {cfg.decoder}, prompt {cfg.prompt}, handler {cfg.bfcl_model}, "
        f"context {cfg.context}; "
        "counted 0 as BFCL does: "
        f"{', '.join(not_run) or 'none'} + web search, memory, Java, JavaScript",
        flush=True,
    )
    if cfg.write_bfcl_files:
        from pathlib import Path

        root = Path(cfg.output_dir) / "bfcl"
        model = cfg.llm.model if client is not None else cfg.policy
        files = write_run_files(root, by_category, model=model, bfcl_model=cfg.bfcl_model)
        tracker.log_artifact(root, "bfcl")
        print(f"egpo.eval: BFCL result/score files and {files['csv']} under {root}", flush=True)
    correct, total = sum(c for c, _ in scores.values()), sum(n for _, n in scores.values())
    note = f"{correct} of {total} tasks in {len(scores)} categories, 95% Wilson"
    line = format_headline("BFCL accuracy", correct / max(total, 1), wilson_interval(correct, total), note)
    return {**{f"bfcl/{c}/accuracy": a for c, a in accuracy.items()}, **summary, "headline": line}


def _record(result: dict) -> dict:
    info = result["info"] or {}
    record = {"valid": result["reward"] == 1.0, "outputs": result["outputs"], "limit": result["limit"]}
    for key in ("decoded", "decode_error", "error", "fc_binary", "multi_turn_error", "action"):
        if key in info:
            record[key] = info[key]
    return record
