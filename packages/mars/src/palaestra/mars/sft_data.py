"""SFT warm-start data: whole game conversations whose assistant turns are legal moves, from OpenSpiel.

`legal_move_conversations` plays self-play games through `GameEnv` with a
scripted player (uniform random legal moves by default, or MCTS) and keeps
each seat's conversation exactly as the model would see it: the env's
observations and, as assistant turns, well-formed responses
``<think></think><answer>MOVE</answer>``. The result is chat data
(``{"messages": [...]}`` rows) for the shared SFT step, which trains on the
assistant tokens only. It teaches the format and legal moves, not strategy.
"""

from __future__ import annotations

from typing import Any

from palaestra.mars.env import GameEnv, Shaping
from palaestra.mars.players import MCTSPlayer, RandomPlayer


def legal_move_conversations(
    game: str,
    episodes: int,
    seed: int = 0,
    mover: str = "random",
    shaping: Shaping | None = None,
    prompt: str = "full",
) -> list[dict[str, Any]]:
    """One row per seat per episode: ``{"messages": [...], "game": ..., "agent": ...}``."""
    env = GameEnv(game, shaping, prompt)
    if mover == "random":
        player = RandomPlayer(seed)
    elif mover == "mcts":
        player = MCTSPlayer(env.game, max_simulations=50, seed=seed)
    else:
        raise ValueError(f"mover must be random or mcts, not {mover!r}")
    rows = []
    for episode in range(episodes):
        env.reset(seed * 100_003 + episode)
        player.reset(seed * 100_003 + episode)
        conversations: dict[str, list[dict]] = {a: [] for a in env.agents}
        while not env.done:
            agent = env.current_agent
            conversations[agent] += env.observe(agent)
            text = player.act(env)
            conversations[agent].append({"role": "assistant", "content": text})
            env.step(text)
        rows += [{"messages": msgs, "game": game, "agent": a} for a, msgs in conversations.items() if msgs]
    return rows
