"""MCTS opponents whose replies run on Ray workers, in parallel across games and ahead of need.

An LLM's evaluation games are played by one rollout loop: each round it generates for every game at once, then
applies each game's response and, in a `VersusEnv`, the opponent's reply, one game after another. An MCTS-1000
reply takes seconds (about 5.7 s per Connect Four move on one core), so the replies dominate. `RayMCTSPlayer`
computes them on Ray: when the learner is to move (`prefetch`, called by `VersusEnv.observe`, before the model
generates), it submits one search per legal learner move (the reply to each move the model may play), so the
searches run beside each other, beside the other games' searches and beside the generation; `act` then takes
the reply to the move played and cancels the others. It costs up to (legal moves) x the searches.

A search is `MCTSPlayer`'s (OpenSpiel's ``MCTSBot``, a fresh tree every move, MARS's uct_c, simulations,
random rollouts and ``solve``), its random state seeded from (seed, the game's reset seed, the position), so a
game's replies do not depend on which games ran beside it or on the order of the loop. ``local=True`` runs the
same searches in this process (no Ray, no look-ahead): the reference the Ray path is tested against.
"""

from __future__ import annotations

import random
from typing import Any

from palaestra.mars.env import GameEnv, render_response
from palaestra.mars.games import make_game
from palaestra.mars.players import Player


def mcts_reply(
    game: str, history: list[int], uct_c: float, simulations: int, rollouts: int, solve: bool, seed: int
) -> int:
    """The MCTS move at the position `history` leads to (run as a Ray task, or in-process)."""
    import numpy as np
    from open_spiel.python.algorithms import mcts

    g = make_game(game)
    state = g.new_initial_state()
    for action in history:
        state.apply_action(action)
    rng = np.random.RandomState(seed)
    evaluator = mcts.RandomRolloutEvaluator(rollouts, rng)
    bot = mcts.MCTSBot(g.openspiel, uct_c, simulations, evaluator, solve=solve, random_state=rng)
    return int(bot.step(state))


class RayMCTSPlayer(Player):
    """MCTS replies computed on Ray workers, one search per legal learner move ahead of the learner's move."""

    name = "mcts"

    def __init__(
        self,
        game,
        uct_c: float = 2.0,
        max_simulations: int = 100,
        rollout_count: int = 10,
        seed: int = 0,
        solve: bool = False,
        cluster=None,
        local: bool = False,
    ):
        self.game, self.seed, self.local = game, seed, local
        self.settings = (uct_c, max_simulations, rollout_count, solve)
        self._futures: dict[tuple[Any, tuple[int, ...]], Any] = {}
        self.searches = 0
        if not local:
            from palaestra.shared import cluster as ray_cluster

            self.ray = ray_cluster.init(cluster, in_process="mcts_on_ray=false (eval.mcts_on_ray in a training config)")
            self._remote = self.ray.remote(num_cpus=1)(mcts_reply)

    def reset(self, seed: int) -> None:
        pass  # each search is seeded by (seed, the game's reset seed, the position): no state between games

    def _seed(self, env: GameEnv, history: tuple[int, ...]) -> int:
        return random.Random(f"mcts/{self.seed}/{env.reset_seed}/{history}").getrandbits(32)

    def _submit(self, env: GameEnv, history: tuple[int, ...]):
        self.searches += 1
        args = (self.game.name, list(history), *self.settings, self._seed(env, history))
        return self._remote.remote(*args)

    def prefetch(self, env: GameEnv) -> None:
        """Submit the reply to each legal move of the player to move (the learner), where the opponent moves next."""
        if self.local or env.done:
            return
        mover = env.state.current_player()
        for action in env.state.legal_actions():
            child = env.state.clone()
            child.apply_action(action)
            if child.is_terminal() or child.current_player() == mover:
                continue
            key = (env.reset_seed, tuple(child.history()))
            if key not in self._futures:
                self._futures[key] = self._submit(env, key[1])

    def act(self, env: GameEnv) -> str:
        history = tuple(env.state.history())
        if self.local:
            self.searches += 1
            action = mcts_reply(self.game.name, list(history), *self.settings, self._seed(env, history))
        else:
            key = (env.reset_seed, history)
            future = self._futures.pop(key, None) or self._submit(env, history)
            siblings = [k for k in self._futures if k[0] == key[0] and len(k[1]) <= len(history)]
            for k in siblings:  # replies to moves the learner did not play
                self.ray.cancel(self._futures.pop(k))
            action = self.ray.get(future)
        return render_response(env.game.action_string(env.state, env.current_player, action))
