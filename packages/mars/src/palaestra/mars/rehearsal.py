"""How ``mars.train`` rehearses (`palaestra.shared.rehearse`): MARS's self-play path at a few steps and episodes.

Scaled: the model (the rehearsal's Qwen3-architecture model, whose template drops earlier turns' ``<think>``
as Qwen3's does), the learner's ranks (2, gloo, on CPU; strategy, gradient checkpointing and micro-batch
budget kept), one rollout worker on CPU (vLLM where importable, else the transformers backend; the weight sync
kept), turns, lengths (the sequence length with them, its margin kept), the batch's environment slots, steps,
rows per step, the minibatch, a checkpoint every step, and the evaluation: every game, opponent and seat kept,
one episode each, MCTS at 10 and 20 simulations for the paper's 100 and 1000. Kept: games, self-play, the full
prompt, shaping, sampling, the forced ``<think>`` prefix, the stop, the advantage, the loss and the optimizer.

The check (`reload_train_checkpoint`) reloads the last checkpoint into a fresh model (manifest verified).
"""

from __future__ import annotations

from typing import Any

from palaestra.shared.rehearse import Rehearsal, RehearsalContext, reload_train_checkpoint

MAX_TOKENS = 24
CONTEXT = 4096


def scale(data: dict[str, Any], ctx: RehearsalContext) -> dict[str, Any]:
    games = data.get("games", [])
    out: dict[str, Any] = {
        **ctx.trainer_placement(),
        "rollout.max_turns": 6,
        "rollout.max_tokens_per_turn": MAX_TOKENS,
        "rollout.max_context_tokens": CONTEXT,
        "steps": 2,
        "tasks_per_step": max(len(games), 1),
        "minibatch_size": 2,
        "checkpoint_every": 1,
        "eval_every": 2,
    }
    shaping = data.get("shaping", {})
    if shaping.get("sequence_length"):
        out["shaping.sequence_length"] = CONTEXT
    if data.get("batch", {}).get("env_slots"):
        out["batch.env_slots"] = [1] * len(data["batch"]["env_slots"])
    evaluation = data.get("eval", {})
    if evaluation:
        out["eval.episodes"] = 1
        out["eval.max_tokens_per_turn"] = MAX_TOKENS
        out["eval.max_context_tokens"] = CONTEXT
        if evaluation.get("mcts_levels"):
            out["eval.mcts_levels"] = [10, 20][: len(evaluation["mcts_levels"])]
        if "mcts_simulations" in evaluation:
            out["eval.mcts_simulations"] = 10
    return out


TRAIN = Rehearsal(scale=scale, check=reload_train_checkpoint)
