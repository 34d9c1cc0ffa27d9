"""Playing many episodes at once: scripted players act at once, LLM players in batches.

`play_episodes` runs episodes of one game in lockstep. Each seat has a player;
every loop, each unfinished game asks its acting agent: scripted players
answer immediately, and all conversations waiting on the same LLM player are
answered by one batched generation call. Each agent keeps its own
conversation (the env's observations plus its own responses), exactly as a
model sees it. Results are plain `EpisodeResult` records.
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


def play_episodes(
    game: str,
    players: list[Any],
    seeds: list[int],
    shaping: Shaping | None = None,
    max_turns: int = 200,
    keep_transcripts: bool = False,
    prompt: str = "full",
) -> list[EpisodeResult]:
    """Play one episode per seed with `players[seat]` in each seat (the same object may fill several seats)."""
    envs = [GameEnv(game, shaping, prompt) for _ in seeds]
    conversations: list[dict[str, list[dict]]] = []
    shaped = [dict.fromkeys(env.agents, 0.0) for env in envs]
    turns = [0] * len(envs)
    finals: list[dict | None] = [None] * len(envs)
    for env, seed in zip(envs, seeds):
        env.reset(seed)
        conversations.append({a: [] for a in env.agents})
    for seat, player in enumerate(players):
        player.reset(seeds[0] * 1009 + seat if seeds else seat)
    active = [i for i, env in enumerate(envs) if not env.done]
    while active:
        waiting: dict[int, list[int]] = {}  # id(LLM player) -> env indices
        responses: dict[int, str] = {}
        for i in active:
            env = envs[i]
            agent = env.current_agent
            conversations[i][agent] += env.observe(agent)
            player = players[env.current_player]
            if getattr(player, "batched", False):
                waiting.setdefault(id(player), []).append(i)
            else:
                responses[i] = player.act(env)
        for indices in waiting.values():
            player = players[envs[indices[0]].current_player]
            texts = player.act_batch([conversations[i][envs[i].current_agent] for i in indices])
            responses.update(zip(indices, texts))
        for i in active:
            env = envs[i]
            agent = env.current_agent
            conversations[i][agent].append({"role": "assistant", "content": responses[i]})
            step = env.step(responses[i])
            turns[i] += 1
            for a, r in step.rewards.items():
                shaped[i][a] += r
            if step.done:
                finals[i] = step.info
            elif turns[i] >= max_turns:
                env.done = True
                finals[i] = {"returns": list(env.state.returns()), "winner": None, "truncated": True}
        active = [i for i in active if not envs[i].done]
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
