"""Trajectories: what a rollout keeps, token for token.

A `Turn` is one model call: the prompt token ids exactly as given to the model,
the response token ids exactly as generated, and the sampler's logprobs. A
`Trajectory` is one agent's side of one episode (a single-agent episode has
one; a two-player game has one per seat), with per-turn rewards.

Token-in, token-out: the engine builds each turn's prompt by appending the
environment's new messages (rendered as a delta after an assistant turn, never
re-rendering the history: `chat_tokens.ChatTokens`) to the previous prompt and
response, so the training sequence of a conversation is simply the last turn's
prompt plus its response. `to_sequence` checks that prefix property and marks
the model's own tokens (mask 1) apart from prompt and environment tokens
(mask 0). The model's output is never decoded and re-tokenized.

Under ``rollout.context=template`` a later prompt re-renders the conversation
(Qwen3's template drops earlier ``<think>`` blocks), so it need not extend the
previous one: `to_sequences` then starts a new training row wherever a prompt
does not extend the row so far, each turn trained on the prompt it was sampled on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One model call by one agent."""

    agent: str
    prompt_ids: list[int]
    """The full prompt as given to the model (the conversation so far)."""
    response_ids: list[int]
    """The tokens as generated (cut at a context limit if one was hit)."""
    response_logprobs: list[float] | None = None
    """Sampler's logprob of each response token (None when the backend gives none)."""
    reward: float = 0.0
    """Reward credited to this turn (the env's reward for this agent after this action)."""
    text: str = ""
    """The decoded response (what the env saw)."""
    action: Any = None
    """The parsed action, as the env reported it in ``info["action"]``."""
    error: str | None = None
    """Why the action did not parse (``info["format_error"]``), if it did not."""
    finish_reason: str = ""
    """stop | length | context."""
    response_versions: list[int] | None = None
    """The policy version (the learner's step count when its weights reached the client) that sampled each
    response token (None: not recorded). An episode that spans a weight update has turns of several versions."""


@dataclass
class Sequence:
    """One training row: a whole conversation of one agent."""

    input_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the model generated, 0 on prompt and environment tokens."""
    turn_index: list[int]
    """Which turn each token belongs to as a response (-1 for prompt/env tokens)."""
    sampler_logprobs: list[float | None]
    versions: list[int] = field(default_factory=list)
    """The policy version of each model token (-1 on prompt/env tokens and where none was recorded)."""


@dataclass
class Trajectory:
    """One agent's side of one episode."""

    env_type: str
    agent: str
    group_id: str
    """Trajectories of the same task (same reset seed) share it: a GRPO group."""
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    limit: str | None = None
    """Which limit truncated it: max_turns | max_tokens | context."""
    failed: bool = False
    error: str | None = None
    """The environment's exception when `failed`."""
    info: dict[str, Any] = field(default_factory=dict)
    """The env's final info (and the reset info under ``task``)."""
    extra_reward: float = 0.0
    """Rewards that arrived before this agent's first turn: in `total_reward`, and credited to its first turn by
    `AdvantageInput.from_trajectories`. An env that must not credit them (MARS drops them) reports none."""

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.turns) + self.extra_reward

    @property
    def num_response_tokens(self) -> int:
        return sum(len(t.response_ids) for t in self.turns)

    def to_sequence(self) -> Sequence:
        """The conversation as one token sequence with the model-token mask (multi-turn aware); raises when a
        turn's prompt does not extend the previous prompt + response (the generated view's invariant)."""
        return self.to_sequences(split=False)[0]

    def to_sequences(self, split: bool) -> list[Sequence]:
        """The training rows of this conversation: consecutive turns whose prompts extend the row so far share
        one; with `split` (the template view) a turn whose prompt does not starts a new row, else that raises.
        ``turn_index`` is the turn's index in the whole trajectory in every row."""
        rows = [Sequence([], [], [], [], [])]
        for k, turn in enumerate(self.turns):
            row = rows[-1]
            if turn.prompt_ids[: len(row.input_ids)] != row.input_ids:
                if not split:
                    raise ValueError(
                        f"turn {k} of agent {self.agent!r}: its prompt does not extend the previous prompt + "
                        "response (the conversation was re-tokenized somewhere)"
                    )
                row = Sequence([], [], [], [], [])
                rows.append(row)
            delta = turn.prompt_ids[len(row.input_ids) :]
            row.input_ids += delta
            row.loss_mask += [0] * len(delta)
            row.turn_index += [-1] * len(delta)
            row.sampler_logprobs += [None] * len(delta)
            row.versions += [-1] * len(delta)
            n = len(turn.response_ids)
            row.input_ids += turn.response_ids
            row.loss_mask += [1] * n
            row.turn_index += [k] * n
            row.sampler_logprobs += list(turn.response_logprobs) if turn.response_logprobs else [None] * n
            row.versions += turn.response_versions or [-1] * n
        return rows
