"""OpenSpiel games as multi-agent text environments (the shared `TextEnv` protocol).

`GameEnv` plays one MARS game between agents ``player_0`` and ``player_1``.
Each agent has its own conversation: its first observation is the system
prompt and a user message with GAME RULES / PLAYER INFORMATION / RESPONSE
INSTRUCTIONS and the first GAME STATE / LEGAL ACTIONS; later ones are a user
message with what happened since it last acted (the board in full for board
games; the other player's actions for poker and Hanabi) and the new state.

A response must be ``<think>...</think><answer>ACTION</answer>`` with ACTION
exactly one of the legal action strings; anything else is a format loss that
ends the game: the offender gets `Game.format_loss` (MARS: -1-10 board,
-bet-10 poker, -score-10 Hanabi), the other agent 0. Rewards per step are the
change in each player's OpenSpiel return, plus the shaping of `Shaping`
(+0.05 per valid turn; at the end +0.1 to a seat with a return of 0 in board
games, never in poker, and in Hanabi when the last step's reward is 0, as
MARS's env code does: `Game.pays_draw_bonus`). Chance nodes are
sampled by the env from its seeded RNG, so ``reset(seed)`` fixes the deal.
As options (MARS's code, on in the paper config): a response that hit the
token limit is a format loss, so is a response after which at most 1,000
tokens of the 32,768-token sequence are left (`Shaping.overlong_sequence`),
and a response longer than 2,048 tokens costs its agent MARS's length
penalty (`Shaping.length_reward`). Every reward OpenSpiel gives is returned,
also one that reaches a seat before its first turn (mini Hanabi). MARS's env
manager drops those; here that is the batch's choice, where rewards are credited
to turns (`palaestra.mars.batching.PreTurnRewards`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from palaestra.mars.games import Game, GameKind, make_game
from palaestra.mars.prompt_text import fill, load_prompt_text
from palaestra.shared.rollout.env import Step, TextEnv

ANSWER_RE = re.compile(r"^\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*$", re.DOTALL)
ANSWER_ONLY_RE = re.compile(r"^\s*(?:<think>(.*?)</think>)?\s*<answer>(.*?)</answer>\s*$", re.DOTALL)
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>")


class PromptStyle(StrEnum):
    """full: MARS's prompts; compact: no rules, instructions or notes (short contexts for tiny CPU models);
    minimal: compact without the system prompt and PLAYER INFORMATION, each turn only what happened since and the
    GAME STATE / LEGAL ACTIONS (the shortest context: the acting seat's private information close to its answer)."""

    full = "full"
    compact = "compact"
    minimal = "minimal"


@dataclass
class Shaping:
    """MARS reward shaping (all from config; zeros give OpenSpiel's payoffs exactly)."""

    valid_turn_bonus: float = 0.05
    """Added to the acting agent's reward for every well-formed, legal turn."""
    draw_bonus: float = 0.1
    """Added at the end of the game by `Game.pays_draw_bonus` (board: return 0; poker: never; Hanabi: last step 0)."""
    format_penalty: float = 10.0
    """Extra penalty on a format loss, on top of losing (board -1, poker -bet, Hanabi -score)."""
    require_think: bool = True
    """Require the ``<think>...</think>`` block before ``<answer>`` (False: the answer alone is enough)."""
    truncated_is_format_loss: bool = False
    """A response that hit the token limit is a format loss (MARS: ``token_length >= 4096`` = max_new_tokens)."""
    length_penalty: float = 0.0
    """MARS's length penalty (env_manager.py ``compute_length_penalty``): with L the response's token count,
    r = 1 - (L - length_min) / (length_max - length_min), and the acting agent gets ``length_penalty * r`` when
    r < 0 (nothing otherwise: MARS's upper scale is 0), on every turn. MARS: 0.5, 11, 2048. 0 = off."""
    length_min: int = 11
    length_max: int = 2048
    sequence_length: int = 0
    """MARS's overlong-sequence rule (env_manager.py ``get_env_input``): a response after which at most
    `sequence_margin` tokens of the `sequence_length`-token sequence are left (sequence_length - prompt tokens -
    response tokens <= sequence_margin) is a format loss. MARS: 32768 (its ``sequence_length``) and 1000. 0 = off."""
    sequence_margin: int = 1000

    def __post_init__(self):
        if self.length_max <= self.length_min:
            raise ValueError(f"length_max ({self.length_max}) must exceed length_min ({self.length_min})")
        if self.sequence_length < 0 or self.sequence_margin < 0:
            raise ValueError(
                f"sequence_length ({self.sequence_length}) and sequence_margin ({self.sequence_margin}) must be >= 0"
            )
        if self.sequence_length and self.sequence_margin >= self.sequence_length:
            raise ValueError(
                f"sequence_margin ({self.sequence_margin}) must be below sequence_length ({self.sequence_length})"
            )

    def overlong_sequence(self, prompt_tokens: int, tokens: int) -> bool:
        """MARS's rule: too few tokens of the sequence are left after this response (False when the rule is off)."""
        return bool(self.sequence_length) and self.sequence_length - prompt_tokens - tokens <= self.sequence_margin

    def length_reward(self, tokens: int) -> float:
        """The length term for a response of `tokens` tokens (<= 0)."""
        r = 1.0 - (tokens - self.length_min) / (self.length_max - self.length_min)
        return self.length_penalty * r if r < 0 else 0.0


def agent_name(player: int) -> str:
    return f"player_{player}"


def parse_answer(text: str, require_think: bool = True) -> tuple[str | None, str | None]:
    """(action text, None) or (None, why it is malformed). Never raises."""
    for marker in END_MARKERS:
        text = text.replace(marker, "")
    match = (ANSWER_RE if require_think else ANSWER_ONLY_RE).match(text)
    if not match:
        need = "<think>...</think><answer>ACTION</answer>" if require_think else "<answer>ACTION</answer>"
        return None, f"response is not of the form {need}"
    return match.group(2).strip(), None


def render_response(action: str, thought: str = "") -> str:
    """The well-formed response that plays `action` (scripted players, SFT targets)."""
    return f"<think>{thought}</think><answer>{action}</answer>"


class GameEnv(TextEnv):
    """One MARS game between two agents, in the `TextEnv` protocol."""

    def __init__(
        self,
        game: str | Game,
        shaping: Shaping | None = None,
        prompt: str = "full",
        opening_moves: int = 0,
        prompt_file: str = "",
    ):
        if prompt not in list(PromptStyle):
            raise ValueError(f"unknown prompt style {prompt!r}; known: {', '.join(PromptStyle)}")
        if opening_moves < 0:
            raise ValueError(f"opening_moves must be >= 0, not {opening_moves}")
        # each reset first plays 0..opening_moves random legal moves (the count drawn uniformly): self-play of a
        # near-deterministic policy then meets varied positions
        self.opening_moves = opening_moves
        self.game = make_game(game) if isinstance(game, str) else game
        self.shaping = shaping or Shaping()
        self.prompt = prompt
        # a lab's wording of the full prompt's sections (`palaestra.mars.prompt_text`); empty: the project's
        self.text = load_prompt_text(prompt_file).get(self.game.name, {}) if prompt_file else {}
        self.agents = [agent_name(p) for p in range(self.game.num_players)]
        self.env_type = self.game.name
        self.state: Any = None  # a pyspiel.State from the first reset on
        self.reset_seed: int | None = None
        self._rng = random.Random(0)
        self._response: tuple[int | None, bool, int] = (None, False, 0)

    # -- protocol ---------------------------------------------------------------
    def reset(self, seed: int | None = None) -> dict[str, Any]:
        # a stream of its own: scripted players are seeded with the same episode seed, and a player's
        # random.Random(seed) would otherwise repeat the draws that dealt the cards (its bets correlated with them)
        self._rng = random.Random(None if seed is None else f"mars-deal/{seed}")
        self.reset_seed = seed
        self.state = self.game.new_initial_state()
        self._resolve_chance()
        for _ in range(self._rng.randint(0, self.opening_moves) if self.opening_moves else 0):
            if self.state.is_terminal():
                break
            self.state.apply_action(self._rng.choice(self.state.legal_actions()))
            self._resolve_chance()
        self._greeted = {a: False for a in self.agents}
        self._unseen: dict[str, list[dict]] = {a: [] for a in self.agents}  # others' moves since a last acted
        self._moves = 0  # moves made so far by all agents: MARS's "Turn-k" counts them
        self.turns = {a: 0 for a in self.agents}
        self.format_loser: str | None = None
        self._response = (None, False, 0)
        self.done = self.state.is_terminal()
        return {"game": self.game.name, "seed": seed}

    @property
    def current_agent(self) -> str:
        return agent_name(self.state.current_player()) if not self.done else self.agents[0]

    @property
    def current_player(self) -> int:
        return self.state.current_player()

    def observe(self, agent: str) -> list[dict]:
        player = self.agents.index(agent)
        unseen, self._unseen[agent] = self._unseen[agent], []
        legal = self.game.legal_action_strings(self.state)
        compact = self.prompt in ("compact", "minimal")
        state = self._state_text(player)
        own = f"GAME STATE:\n{state}\n\nLEGAL ACTIONS:\n{', '.join(legal)}."
        if compact:
            parts = (
                []
                if self.game.kind == GameKind.board or not unseen
                else ["\n".join(f"{u['agent']} took action {u['action']}." for u in unseen)]
            )
            turn = "\n\n".join([*parts, own])
        else:  # MARS's framing (roll/agentic/rollout/env_manager.py, _format_messages)
            turn = "".join(self._other_turn(u) for u in unseen) + (
                f"Information of Turn-{self._moves + 1}:\n\nThis is your turn. The game state and legal actions for "
                "this turn are provided below. Please choose your action and strictly follow the given output "
                f"format in the response instructions.\n\n{own}"
            )
        if self._greeted[agent]:
            return [{"role": "user", "content": turn}]
        self._greeted[agent] = True
        if self.prompt == "minimal":
            return [{"role": "user", "content": turn}]
        if compact:
            first = f"PLAYER INFORMATION:\n{self.game.player_information(player)}\n\n{turn}"
            return [{"role": "system", "content": self.game.system_prompt()}, {"role": "user", "content": first}]
        first = (
            f"GAME RULES:\n{self._section('rules', player)}\n\n"
            f"PLAYER INFORMATION:\n{self._section('player_information', player)}\n\n"
            f"RESPONSE INSTRUCTIONS:\n{self._section('response_instructions', player)}\n\n{turn}"
        )
        return [{"role": "system", "content": self._section("system", player)}, {"role": "user", "content": first}]

    def _section(self, name: str, player: int) -> str:
        """A section of the full prompt: the lab's text from ``prompt_file`` if it has one, else the project's."""
        example = self.game.example_action(player)
        if name in self.text:
            marks = {"mark": "XO"[player], "other_mark": "XO"[1 - player]} if self.game.kind == GameKind.board else {}
            return fill(self.text[name], player=player, other=1 - player, example=example, **marks)
        if name == "system":
            return self.game.system_prompt()
        if name == "rules":
            return self.game.rules()
        if name == "player_information":
            return self.game.full_player_information(player)
        return self.response_instructions(example)

    def _state_text(self, player: int) -> str:
        """GAME STATE as `player` sees it (a board game's board alone, as MARS renders it)."""
        return self.game.render_state(self.state, player)

    def _other_turn(self, u: dict) -> str:
        """Another agent's turn as MARS shows it: the full state for board games, the action alone otherwise."""
        head = f"Information of Turn-{u['turn']}:\n\nThis is the other player's turn. "
        if self.game.kind == GameKind.board:
            return (
                head + "The game state, legal actions, as well as the chosen action of the other player for this "
                f"turn are provided below.\n\nGAME STATE:\n{u['state']}\n\nLEGAL ACTIONS:\n{', '.join(u['legal'])}."
                f"\n\nCHOSEN ACTION:\n{u['action']}\n"
            )
        return (
            head + "The game state for this turn is not available to you. The chosen action of the other player "
            f"for this turn is provided below.\n\nCHOSEN ACTION:\n{u['action']}\n"
        )

    def response_instructions(self, example: str) -> str:
        """MARS's instructions in the project's words: think first, then only ``<answer>ACTION</answer>``; the
        example shows the answer alone, as MARS's does (the response starts inside ``<think>``)."""
        loss = (
            "ends the game at once with all life tokens lost" if self.game.cooperative else "loses the game immediately"
        )
        return (
            "Always choose exactly one action from the legal actions. When you have finished thinking, output "
            "<answer>{your chosen action}</answer> and nothing after it; for example, "
            f"<answer>{example}</answer>. Keep your thinking concise and follow this format strictly: a response "
            f"that does not follow it {loss}."
        )

    def step(self, action: str) -> Step:
        """Apply the acting agent's raw response text."""
        if self.done:
            raise RuntimeError("step() on a finished game; call reset()")
        (tokens, truncated, prompt_tokens), self._response = self._response, (None, False, 0)
        agent = agent_name(self.state.current_player())
        action_text, error = parse_answer(action, self.shaping.require_think)
        action_id = None
        if truncated and self.shaping.truncated_is_format_loss:
            error = "the response hit the token limit"
        elif tokens is not None and self.shaping.overlong_sequence(prompt_tokens, tokens):
            error = f"at most {self.shaping.sequence_margin} tokens of the sequence are left"
        elif error is None and action_text is not None:
            action_id = self.game.action_from_string(self.state, action_text)
            if action_id is None:
                error = f"{action_text!r} is not a legal action"
        if action_id is not None and error is None:
            step = self.step_action(action_id)
        else:
            step = self._format_loss(error or "no action", action_text)
        if tokens is not None:
            step.rewards[agent] = step.rewards.get(agent, 0.0) + self.shaping.length_reward(tokens)
        return step

    def note_response(self, tokens: int, truncated: bool, prompt_tokens: int = 0) -> None:
        """The next `step`'s response and prompt lengths (the rollout engine tells them): scored by the length
        rules."""
        self._response = (tokens, truncated, prompt_tokens)

    def step_action(self, action_id: int) -> Step:
        """Apply a legal OpenSpiel action of the acting agent (scripted players use this directly)."""
        player = self.state.current_player()
        agent = agent_name(player)
        text = self.game.action_string(self.state, player, action_id)
        self._moves += 1
        for other in self.agents:
            if other != agent:
                seen = {"agent": agent, "turn": self._moves, "action": text}
                if self.game.kind == GameKind.board and self.prompt == "full":
                    seen["state"] = self._state_text(self.agents.index(other))
                    seen["legal"] = self.game.legal_action_strings(self.state)
                self._unseen[other].append(seen)
        before = self.state.returns()
        self.state.apply_action(action_id)
        self._resolve_chance()
        after = self.state.returns()
        rewards = {a: after[i] - before[i] for i, a in enumerate(self.agents)}
        rewards[agent] += self.shaping.valid_turn_bonus
        self.turns[agent] += 1
        info: dict[str, Any] = {"action": text, "action_id": action_id, "player": player}
        self.done = self.state.is_terminal()
        if self.done:
            returns = self.state.returns()
            for i, a in enumerate(self.agents):
                if self.game.pays_draw_bonus(returns[i], after[i] - before[i]):
                    rewards[a] += self.shaping.draw_bonus
            info.update(self._outcome(returns))
        return Step(rewards=rewards, terminated=self.done, info=info)

    # -- helpers -------------------------------------------------------------------
    def legal_actions(self) -> list[str]:
        return self.game.legal_action_strings(self.state)

    def _resolve_chance(self) -> None:
        while self.state.is_chance_node():
            outcomes, probs = zip(*self.state.chance_outcomes())
            self.state.apply_action(self._rng.choices(outcomes, weights=probs)[0])

    def _format_loss(self, error: str, action_text: str | None) -> Step:
        player = self.state.current_player()
        agent = agent_name(player)
        rewards = {a: 0.0 for a in self.agents}
        rewards[agent] = self.game.format_loss(self.state, player, self.shaping.format_penalty)
        self.format_loser = agent
        self.done = True
        info = {"format_error": error, "action": action_text, "player": player}
        # the offender loses; in a cooperative game the team's score counts as lost too
        returns = [0.0] * len(self.agents) if self.game.cooperative else [1.0] * len(self.agents)
        if not self.game.cooperative:
            returns[player] = -1.0
        info.update(self._outcome(returns, format_loss=True))
        return Step(rewards=rewards, terminated=True, info=info)

    def _outcome(self, returns: list[float], format_loss: bool = False) -> dict[str, Any]:
        if self.game.cooperative:
            winner = None
        elif returns[0] == returns[1]:
            winner = -1
        else:
            winner = int(returns[1] > returns[0])
        return {
            "returns": list(returns),
            "winner": winner,
            "format_loss": format_loss,
            "format_loser": self.format_loser,
            "history": list(self.state.history()),
        }
