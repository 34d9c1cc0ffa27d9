"""Players of a MARS game: scripted bots and LLM policies, all speaking through the text env.

Every player answers with response text (``<think>..</think><answer>ACTION</answer>``)
so that bots and models go through the same parsing path. Scripted players
(`act`) pick an OpenSpiel action; LLM players (`act_batch`) answer many
conversations in one batched generation call.

- `RandomPlayer`: a uniformly random legal action.
- `MCTSPlayer`: OpenSpiel's ``MCTSBot`` (UCT constant `uct_c`, `max_simulations`,
  random-rollout evaluator; MARS's 10 rollouts and ``solve=False`` by default). On poker it searches
  the true state, i.e. it sees the hidden cards, as MARS's built-in MCTS opponent does.
- `TabularPolicyPlayer`: samples a tabular policy by information state (CFR for
  Kuhn, CFR+ for Leduc; see `solvers`).
- `LLMPlayer`: any `LLMClient` (a frozen checkpoint, a served model), temperature from config.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from palaestra.mars.env import GameEnv, render_response


class Player:
    """A scripted player: one action per call."""

    name = "player"
    batched = False

    def reset(self, seed: int) -> None:
        """Called before each episode (seeds the player's own randomness)."""

    def act(self, env: GameEnv) -> str:
        raise NotImplementedError


class RandomPlayer(Player):
    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def reset(self, seed: int) -> None:
        self.rng.seed(seed)

    def act(self, env: GameEnv) -> str:
        return render_response(self.rng.choice(env.legal_actions()))


class MCTSPlayer(Player):
    """OpenSpiel MCTS with random rollouts (MARS's evaluation opponent)."""

    name = "mcts"

    def __init__(
        self,
        game,
        uct_c: float = 2.0,
        max_simulations: int = 100,
        rollout_count: int = 10,
        seed: int = 0,
        solve: bool = False,
    ):
        """MARS's defaults (``roll/agentic/env/tictactoe/config.py``, ``connect_four/config.py``): uct_c 2,
        10 random rollouts per leaf, ``solve=False`` (``solve=True`` backs up proven wins and is stronger)."""
        from open_spiel.python.algorithms import mcts

        self._mcts = mcts
        self.game, self.uct_c, self.max_simulations, self.rollout_count = game, uct_c, max_simulations, rollout_count
        self.solve = solve
        self.reset(seed)

    def reset(self, seed: int) -> None:
        self.seed = seed
        rng = np.random.RandomState(seed % 2**32)
        evaluator = self._mcts.RandomRolloutEvaluator(self.rollout_count, rng)
        self.bot = self._mcts.MCTSBot(
            self.game.openspiel, self.uct_c, self.max_simulations, evaluator, solve=self.solve, random_state=rng
        )

    def __getstate__(self) -> dict:
        # OpenSpiel's bot does not pickle: an env sent to a rollout worker (the trainer's evaluation on Ray)
        # carries the settings and rebuilds the bot there; every episode's reset seeds it afresh anyway
        return {k: v for k, v in self.__dict__.items() if k not in ("bot", "_mcts")}

    def __setstate__(self, state: dict) -> None:
        from open_spiel.python.algorithms import mcts

        self.__dict__.update(state, _mcts=mcts)
        self.reset(self.seed)

    def act(self, env: GameEnv) -> str:
        action = self.bot.step(env.state)
        return render_response(env.game.action_string(env.state, env.current_player, action))


class TabularPolicyPlayer(Player):
    """Samples ``{information state: [(action, prob), ...]}`` (an equilibrium from `solvers`)."""

    def __init__(self, table: dict[str, list[tuple[int, float]]], name: str = "cfr", seed: int = 0):
        self.table, self.name = table, name
        self.rng = random.Random(seed)

    def reset(self, seed: int) -> None:
        self.rng.seed(seed)

    def act(self, env: GameEnv) -> str:
        player = env.current_player
        probs = self.table.get(env.state.information_state_string(player))
        if probs is None:  # unreachable under the solver's own play; never expected on legal states
            raise KeyError(f"information state not in the policy table: {env.state.information_state_string(player)}")
        actions, weights = zip(*probs)
        action = self.rng.choices(actions, weights=weights)[0]
        return render_response(env.game.action_string(env.state, player, action))


@dataclass
class LLMPlayer:
    """An LLM policy: answers a batch of conversations in one `LLMClient.chat` call."""

    client: Any
    """A `palaestra.shared.llm.LLMClient`."""
    temperature: float = 0.6
    max_tokens: int = 256
    name: str = "llm"
    seed: int = 0
    stop: list[str] = field(default_factory=lambda: ["</answer>"])
    top_p: float = 1.0
    top_k: int = 0
    response_prefix: str = ""
    """Forced start of every response, as the policy's (`RolloutConfig.response_prefix`): prompt tokens after the
    generation prompt, and part of the answer the env reads."""
    batched: bool = field(default=True, init=False)
    calls: int = field(default=0, init=False)

    def reset(self, seed: int) -> None:
        pass

    def act_batch(self, conversations: list[list[dict]]) -> list[str]:
        from palaestra.shared.llm import SamplingParams

        params = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=list(self.stop),
            seed=self.seed + self.calls,
            logprobs=False,
        )
        self.calls += 1
        if not self.response_prefix:
            return [c.text for c in self.client.chat(conversations, params)]
        prefix = self.client.tokenizer.encode(self.response_prefix, add_special_tokens=False)
        prompts = [self.client.render(c) + prefix for c in conversations]
        return [self.response_prefix + c.text for c in self.client.generate(prompts, params)]
