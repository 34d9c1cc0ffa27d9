"""Episodes between scripted players (random, MCTS, tabular policies), and the `EpisodeResult` record.

`play_episodes` steps episodes of one game with a scripted player in each seat.
LLM policies never come here: they play through the shared rollout engine
(`engine_eval`), the same path training samples with, so there is one episode
runner for models. Each seat keeps its own conversation (the env's observations
plus its responses) when ``keep_transcripts`` asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from palaestra.mars.env import GameEnv, Shaping


@dataclass
class EpisodeResult:
    game: str
    seed: int
    returns: list[float]
    """OpenSpiel returns per seat (a format loss counts as -1 / +1, or 0 for the team in Hanabi)."""
    shaped: list[float]
    """Sum of the env's shaped rewards per seat (what training sees)."""
    winner: int | None
    """Seat that won, -1 for a draw, None in cooperative games."""
    format_loser: int | None
    turns: int
    transcript: dict[str, list[dict]] = field(default_factory=dict)
    truncated: bool = False
    """Cut by a limit (context, turns) before the game ended: no winner, returns 0."""
    failed: bool = False
    """The env raised (the error is in the rollout's trajectories): no winner, returns 0."""


def play_episodes(
    game: str,
    players: list[Any],
    seeds: list[int],
    shaping: Shaping | None = None,
    max_turns: int = 200,
    keep_transcripts: bool = False,
    prompt: str = "full",
    prompt_file: str = "",
) -> list[EpisodeResult]:
    """Play one episode per seed with scripted `players[seat]` in each seat (one object may fill several seats)."""
    for player in players:
        if getattr(player, "batched", False):
            raise ValueError("play_episodes takes scripted players; LLM players play through engine_eval")
    envs = [GameEnv(game, shaping, prompt, prompt_file=prompt_file) for _ in seeds]
    conversations: list[dict[str, list[dict]]] = []
    shaped = [dict.fromkeys(env.agents, 0.0) for env in envs]
    turns = [0] * len(envs)
    finals: list[dict | None] = [None] * len(envs)
    for seat, player in enumerate(players):
        player.reset(seeds[0] * 1009 + seat if seeds else seat)
    for i, (env, seed) in enumerate(zip(envs, seeds)):
        env.reset(seed)
        conversations.append({a: [] for a in env.agents})
        while not env.done:
            agent = env.current_agent
            conversations[i][agent] += env.observe(agent)
            text = players[env.current_player].act(env)
            conversations[i][agent].append({"role": "assistant", "content": text})
            step = env.step(text)
            turns[i] += 1
            for a, r in step.rewards.items():
                shaped[i][a] += r
            if step.done:
                finals[i] = step.info
            elif turns[i] >= max_turns:
                env.done = True
                finals[i] = {"returns": list(env.state.returns()), "winner": None, "truncated": True}
    results = []
    for i, env in enumerate(envs):
        info = finals[i] or {}
        loser = info.get("format_loser")
        results.append(
            EpisodeResult(
                game=game,
                seed=seeds[i],
                returns=[float(r) for r in info.get("returns", [])],
                shaped=[shaped[i][a] for a in env.agents],
                winner=info.get("winner"),
                format_loser=env.agents.index(loser) if loser else None,
                turns=turns[i],
                transcript=conversations[i] if keep_transcripts else {},
            )
        )
    return results
