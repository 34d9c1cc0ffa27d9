"""The text-environment protocol (gymnasium / PettingZoo AEC convention).

One protocol covers three shapes of task:

- single-turn: one agent, `step` once, terminated;
- multi-turn tool use: one agent; each `step` executes the model's calls and the
  next observation is the tool responses (``role: tool`` messages);
- multi-agent turn-based games: `current_agent` changes after each step; each
  agent has its own conversation and sees only what `observe` gives it.

Protocol, per episode::

    env.reset(seed)
    while not done:
        agent = env.current_agent
        messages = env.observe(agent)       # new chat messages for this agent's context
        step = env.step(action_text)        # the model's raw text; parsing is the env's business
        # step.rewards: per-agent rewards of this step; step.terminated / truncated; step.info

A response the env cannot parse is a format failure the env scores (a
penalty, usually ending the episode), never an exception. An env that raises
marks its episode failed in the engine (counted and reported; the trainer's
step stops when more than ``rollout.max_failed_share`` of its episodes fail).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from palaestra.shared.registry import Registry


@dataclass
class Step:
    """What one `step` returns."""

    rewards: dict[str, float] = field(default_factory=dict)
    """Reward of this step per agent (agents missing from the dict get 0)."""
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """E.g. ``action`` (the parsed action), ``format_error`` (why it did not parse), ``outcome``."""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class TextEnv:
    """Base class of text environments. Subclasses set `agents` and implement the four methods."""

    agents: list[str] = ["agent"]
    env_type: str = "text"
    """Groups environments for per-environment statistics (e.g. MARS's agent normalization by game)."""

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        """Start an episode; return info (e.g. the task)."""
        raise NotImplementedError

    @property
    def current_agent(self) -> str:
        return self.agents[0]

    def observe(self, agent: str) -> list[dict]:
        """The chat messages to append to `agent`'s context before it acts (first call: system + user)."""
        raise NotImplementedError

    def step(self, action: str) -> Step:
        """Apply the acting agent's raw response text."""
        raise NotImplementedError

    def note_response(self, tokens: int, truncated: bool, prompt_tokens: int = 0) -> None:
        """Called by the rollout engine right before `step`: how many tokens the model generated for this response,
        whether it stopped at the token limit, and how long the prompt it answered was (forced response prefix
        included) (an env may score length; the default ignores it)."""

    def tools(self, agent: str) -> list[dict] | None:
        """JSON-schema tools for `agent`'s chat template, or None."""
        return None


ENVS: Registry[type[TextEnv]] = Registry("environment", "palaestra.envs")
ENVS.register("task", "palaestra.shared.rollout.tasks:TaskEnv")  # single-turn tasks: a task source + a reward
ENVS.register("solver_critic", "palaestra.shared.rollout.solver_critic:SolverCriticEnv")  # two roles on a task
