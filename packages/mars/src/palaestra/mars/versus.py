"""Training against a fixed opponent: a game env in which only the learner's seat is an agent.

`VersusEnv` wraps a `GameEnv` and plays the other seat itself with a scripted
player (random, MCTS, an equilibrium) or a frozen LLM checkpoint, so the
rollout engine sees a single-agent environment. The learner's seat is fixed
(``first``/``second``) or alternates with the reset seed (``alternate``). The
learner's reward of a step includes what the opponent's replies caused (e.g.
-1 when the opponent completes a line), so the turn that allowed it is
credited. Its agent name is the real seat (``player_0``/``player_1``), so
agent normalization still groups by seat.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from palaestra.mars.env import GameEnv
from palaestra.shared.rollout.env import Step, TextEnv


class LearnerSeat(StrEnum):
    """The learner's seat: first, second, or alternating with the reset seed."""

    first = "first"
    second = "second"
    alternate = "alternate"


class VersusEnv(TextEnv):
    """One game seat for the learner; the other seat is played by `opponent`."""

    def __init__(self, env: GameEnv, opponent: Any, seat: str = "alternate"):
        if seat not in list(LearnerSeat):
            raise ValueError(f"seat must be {', '.join(LearnerSeat)}, not {seat!r}")
        self.env, self.opponent, self.seat = env, opponent, seat
        self.env_type = env.env_type
        self.agents = [env.agents[0]]
        self._opp_conversation: list[dict] = []

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        info = self.env.reset(seed)
        seed = seed or 0
        player = {LearnerSeat.first: 0, LearnerSeat.second: 1}.get(LearnerSeat(self.seat), seed % 2)
        self.agents = [self.env.agents[player]]
        self.opponent.reset(seed)
        self._opp_conversation = []
        self._pending = 0.0
        self._opponent_moves()
        return {**info, "learner_seat": player}

    @property
    def current_agent(self) -> str:
        return self.agents[0]

    def observe(self, agent: str) -> list[dict]:
        prefetch = getattr(self.opponent, "prefetch", None)
        if prefetch is not None:  # an opponent that searches ahead (parallel_mcts.RayMCTSPlayer) starts now
            prefetch(self.env)
        return self.env.observe(agent)

    def step(self, action: str) -> Step:
        me = self.agents[0]
        step = self.env.step(action)
        reward = step.rewards.get(me, 0.0)
        if not step.done:
            final = self._opponent_moves()
            reward += self._pending
            self._pending = 0.0
            if final is not None:
                step = final
        return Step(rewards={me: reward}, terminated=step.terminated, truncated=step.truncated, info=step.info)

    def _opponent_moves(self) -> Step | None:
        """Let the opponent act until it is the learner's turn; return the last step if the game ended."""
        me = self.agents[0]
        last = None
        while not self.env.done and self.env.current_agent != me:
            agent = self.env.current_agent
            if getattr(self.opponent, "batched", False):  # a frozen LLM: one conversation at a time
                self._opp_conversation += self.env.observe(agent)
                text = self.opponent.act_batch([self._opp_conversation])[0]
                self._opp_conversation.append({"role": "assistant", "content": text})
            else:
                text = self.opponent.act(self.env)
            last = self.env.step(text)
            self._pending += last.rewards.get(me, 0.0)
        return last if self.env.done else None
