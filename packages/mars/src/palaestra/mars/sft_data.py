"""SFT warm-start data: whole game conversations whose assistant turns are legal moves, from OpenSpiel.

`legal_move_conversations` plays games through `GameEnv` with scripted players
and keeps a seat's conversation exactly as the model would see it: the env's
observations and, as assistant turns, well-formed responses
``<think></think><answer>MOVE</answer>``. The result is chat data
(``{"messages": [...]}`` rows) for the shared SFT step, which trains on the
assistant tokens only. It teaches the format and legal moves, not strategy.

The mover picks the recorded moves:

- ``random``: a uniformly random legal action (the default);
- ``first``: one of the first ``first_k`` items of the LEGAL ACTIONS list,
  uniformly (default 1: the first item). A small model learns this by copying
  from fixed places in the prompt; picking any listed item needs an in-context
  lookup that the 2M-parameter `tiny` model does not learn in a CPU budget
  (measured: see the mars README). ``first_k: 2`` keeps the policy stochastic,
  so that self-play explores and RL has a choice to learn;
- ``mcts``: OpenSpiel MCTS (50 simulations);
- ``equilibrium`` (poker): samples the cached CFR / CFR+ equilibrium (`solvers`); with
  ``random_fraction`` a stochastic, card-aware, non-optimal policy (the Kuhn demonstration's
  warm start of its first runs: half equilibrium, half uniform);
- ``card_strength`` (Kuhn poker): bet or call with probability ``strength[card]`` (J, Q, K), pass or fold
  otherwise, whatever the betting: a card-aware, non-optimal rule of thumb whose targets differ strongly by
  card (a 2M model learns to read its card from them in a CPU budget, where half-equilibrium data left it
  card-blind; see ``docs/experiments/``).

``random_fraction`` mixes in uniformly random legal moves (with ``mover:
first``: a policy that keeps some entropy for self-play to explore with, and
histories that do not always follow the first-item pattern).

``opponent: self`` plays the mover in every seat and keeps every seat's
conversation; ``opponent: random`` plays the mover in one seat (alternating by
episode) against uniformly random moves and keeps that seat only, so that the
boards vary even when the mover is deterministic.
"""

from __future__ import annotations

import random
from enum import StrEnum
from typing import Any

from palaestra.mars.env import GameEnv, Shaping, render_response
from palaestra.mars.players import MCTSPlayer, Player, RandomPlayer


class Mover(StrEnum):
    """Who makes the recorded moves."""

    random = "random"
    first = "first"
    mcts = "mcts"
    equilibrium = "equilibrium"
    card_strength = "card_strength"


class Partner(StrEnum):
    """Who plays the other seat: the mover itself or a random player."""

    self = "self"
    random = "random"


class MixturePlayer(Player):
    """`base` mixed with uniformly random legal actions: random with probability `random_fraction`."""

    def __init__(self, base: Player, random_fraction: float, seed: int = 0):
        self.base, self.random_fraction = base, random_fraction
        self.rng = random.Random(seed)

    def reset(self, seed: int) -> None:
        self.base.reset(seed)
        self.rng.seed(seed + 1)

    def act(self, env: GameEnv) -> str:
        if self.rng.random() < self.random_fraction:
            return render_response(self.rng.choice(env.legal_actions()))
        return self.base.act(env)


class FirstLegalPlayer(Player):
    """One of the first `k` actions of the LEGAL ACTIONS list, uniformly (any legal action with probability
    `random_fraction`)."""

    name = "first"

    def __init__(self, random_fraction: float = 0.0, seed: int = 0, k: int = 1):
        self.k = k
        self.random_fraction = random_fraction
        self.rng = random.Random(seed)

    def reset(self, seed: int) -> None:
        self.rng.seed(seed)

    def act(self, env: GameEnv) -> str:
        legal = env.legal_actions()
        if self.rng.random() < self.random_fraction:
            return render_response(self.rng.choice(legal))
        return render_response(self.rng.choice(legal[: self.k]))


class CardStrengthPlayer(Player):
    """Kuhn poker: bet or call with probability ``strength[card]`` (card 0, 1, 2 = J, Q, K), else pass or fold."""

    name = "card_strength"

    def __init__(self, strength: list[float], seed: int = 0):
        if len(strength) != 3 or not all(0.0 <= p <= 1.0 for p in strength):
            raise ValueError(f"card_strength needs three probabilities in [0, 1] (J, Q, K), not {strength!r}")
        self.strength = [float(p) for p in strength]
        self.rng = random.Random(seed)

    def reset(self, seed: int) -> None:
        self.rng.seed(seed)

    def act(self, env: GameEnv) -> str:
        card = env.state.history()[env.current_player]
        return render_response("<BET>" if self.rng.random() < self.strength[card] else "<PASS>")


def legal_move_conversations(
    game: str,
    episodes: int,
    seed: int = 0,
    mover: str = "random",
    opponent: str = "self",
    random_fraction: float = 0.0,
    first_k: int = 1,
    shaping: Shaping | None = None,
    prompt: str = "full",
    equilibrium_cache: str = "outputs/mars/cache",
    strength: list[float] | None = None,
    prompt_file: str = "",
) -> list[dict[str, Any]]:
    """One row per recorded seat per episode: ``{"messages": [...], "game": ..., "agent": ...}``."""
    if mover not in list(Mover):
        raise ValueError(f"mover must be one of {', '.join(Mover)}, not {mover!r}")
    if not 0.0 <= random_fraction <= 1.0:
        raise ValueError(f"random_fraction must be in [0, 1], not {random_fraction}")
    if first_k < 1:
        raise ValueError(f"first_k must be >= 1, not {first_k}")
    if opponent not in list(Partner):
        raise ValueError(f"opponent must be one of {', '.join(Partner)}, not {opponent!r}")
    if mover == "card_strength" and (game != "kuhn_poker" or strength is None):
        raise ValueError(
            f"mover card_strength is for kuhn_poker with strength: [pJ, pQ, pK] (got {game!r}, {strength})"
        )
    env = GameEnv(game, shaping, prompt, prompt_file=prompt_file)
    if mover == "random":
        player: Player = RandomPlayer(seed)
    elif mover == "first":
        player = FirstLegalPlayer(random_fraction, seed, first_k)
    elif mover == "card_strength":
        assert strength is not None  # checked above
        player = CardStrengthPlayer(strength, seed)
    elif mover == "mcts":
        player = MCTSPlayer(env.game, max_simulations=50, rollout_count=1, seed=seed, solve=True)
    else:
        from palaestra.mars.players import TabularPolicyPlayer
        from palaestra.mars.solvers import equilibrium_policy

        table = equilibrium_policy(game, cache_dir=equilibrium_cache).table
        player = MixturePlayer(TabularPolicyPlayer(table, seed=seed), random_fraction, seed)
    other = RandomPlayer(seed + 1) if opponent == "random" else player
    rows = []
    for episode in range(episodes):
        env.reset(seed * 100_003 + episode)
        player.reset(seed * 100_003 + episode)
        if other is not player:  # a self-play mover keeps its own seed
            other.reset(seed * 100_003 + episode + 1)
        recorded = env.agents if opponent == "self" else [env.agents[episode % len(env.agents)]]
        conversations: dict[str, list[dict]] = {a: [] for a in env.agents}
        while not env.done:
            agent = env.current_agent
            conversations[agent] += env.observe(agent)
            text = (player if agent in recorded else other).act(env)
            conversations[agent].append({"role": "assistant", "content": text})
            env.step(text)
        rows += [{"messages": conversations[a], "game": game, "agent": a} for a in recorded if conversations[a]]
    return rows
