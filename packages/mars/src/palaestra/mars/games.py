"""The MARS games: OpenSpiel games described in text, as the MARS code prompts them.

Each `Game` wraps one OpenSpiel game (``pyspiel``) and knows how to talk about
it: the system prompt ("You are an AI agent that makes optimal decisions to
win in the game of ..."), the GAME RULES and PLAYER INFORMATION sections, how a
state looks to one player (GAME STATE), and the action strings (``<X(0,0)>``,
``<BET>``, ``<Play card 0>``). The game logic is OpenSpiel's, never ours.

A game's facts live on its class: its kind, title and OpenSpiel parameters, whether it is cooperative, its
reference solver, MARS's end-of-game bonus and format loss, and what was measured of it for
``palaestra plan``. Seats, chance and perfect information come from OpenSpiel. A new game is one new file
with its class and one registration below. The families: `palaestra.mars.board_games` (``tic_tac_toe``,
``connect_four``), `palaestra.mars.poker_games` (``kuhn_poker``, ``leduc_poker``) and
`palaestra.mars.hanabi_games` (``mini_hanabi``, ``simple_hanabi``, ``full_hanabi``). MARS trains on
tic-tac-toe, Kuhn poker and mini Hanabi; the others are held out.

>>> game = make_game("tic_tac_toe")
>>> state = game.new_initial_state()
>>> game.legal_action_strings(state)[:3]
['<X(0,0)>', '<X(0,1)>', '<X(0,2)>']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, ClassVar

import pyspiel

from palaestra.shared.registry import Registry


class GameKind(StrEnum):
    """How the other seat's moves are shown: board (the full state) | poker, hanabi (the action alone)."""

    board = "board"
    poker = "poker"
    hanabi = "hanabi"


class Game:
    """One OpenSpiel game and its text interface; a subclass states its facts and renders states and actions."""

    name: ClassVar[str] = ""
    """The registry name (``tic_tac_toe``)."""
    openspiel_name: ClassVar[str] = ""
    params: ClassVar[Mapping[str, Any]] = {}
    """OpenSpiel's game parameters."""
    kind: ClassVar[GameKind]
    title: ClassVar[str] = ""
    """How the system prompt names the game."""
    cooperative: ClassVar[bool] = False
    """True for Hanabi: both seats share the score and are scored in self-play."""
    solver: ClassVar[tuple[str, int] | None] = None
    """The reference equilibrium: OpenSpiel solver and iterations (`palaestra.mars.solvers`); None: none.
    A game with one is played against it and its exploitability is exact."""
    mean_moves: ClassVar[float] = 0.0
    """Mean moves (all seats) per game under random play (``palaestra plan``'s evaluation estimate)."""
    mean_legal_moves: ClassVar[float] = 0.0
    """Mean legal moves per position under random play (searches run ahead per MCTS reply)."""
    mcts_seconds: ClassVar[Mapping[int, float]] = {}
    """CPU seconds per MCTS reply by simulations, measured (see `palaestra.mars.eval_cost`)."""

    def __init__(self) -> None:
        self.openspiel = pyspiel.load_game(self.openspiel_name, dict(self.params))

    # -- the game -----------------------------------------------------------
    @property
    def num_players(self) -> int:
        return self.openspiel.num_players()

    @property
    def has_chance(self) -> bool:
        """Chance nodes (deals, draws): the env samples them from its seeded RNG."""
        return self.openspiel.get_type().chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC

    @property
    def perfect_information(self) -> bool:
        """Every seat sees the whole state: OpenSpiel's MCTS can play it without seeing hidden cards."""
        return self.openspiel.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION

    def new_initial_state(self) -> pyspiel.State:
        return self.openspiel.new_initial_state()

    def legal_action_strings(self, state: pyspiel.State) -> list[str]:
        player = state.current_player()
        return [self.action_string(state, player, a) for a in state.legal_actions(player)]

    def action_from_string(self, state: pyspiel.State, text: str) -> int | None:
        """The legal action whose string is exactly `text`, else None."""
        player = state.current_player()
        for action in state.legal_actions(player):
            if self.action_string(state, player, action) == text:
                return action
        return None

    # -- text ---------------------------------------------------------------
    def system_prompt(self) -> str:
        goal = "achieve the highest score" if self.cooperative else "win"
        return f"You are an AI agent that makes optimal decisions to {goal} in the game of {self.title}."

    def action_string(self, state: pyspiel.State, player: int, action: int) -> str:
        raise NotImplementedError

    def rules(self) -> str:
        raise NotImplementedError

    def player_information(self, player: int) -> str:
        """The short PLAYER INFORMATION of the compact prompts."""
        raise NotImplementedError

    def full_player_information(self, player: int) -> str:
        """PLAYER INFORMATION of the full prompt, MARS's points in order: who you are, then what each turn
        shows, how to choose, and how the legal actions are written (MARS's ``_get_prefix_prompt``)."""
        raise NotImplementedError

    def example_action(self, player: int) -> str:
        """The action in the RESPONSE INSTRUCTIONS' example (MARS's ``FORMAT_PROMPT_EXAMPLE``)."""
        raise NotImplementedError

    def render_state(self, state: pyspiel.State, player: int) -> str:
        """GAME STATE as `player` sees it (never the opponent's private information)."""
        raise NotImplementedError

    # -- MARS's shaping --------------------------------------------------------
    def format_loss(self, state: pyspiel.State, player: int, penalty: float) -> float:
        """Reward to `player` whose response broke the format (MARS: -1-10 board, -bet-10 poker, -score-10 Hanabi)."""
        raise NotImplementedError

    def pays_draw_bonus(self, final_return: float, last_step_reward: float) -> bool:
        """Whether a seat gets the draw bonus at the end of the game (MARS's env code: board games on a 0 return;
        poker never, a Leduc split pot included; Hanabi when the last step's reward is 0)."""
        return final_return == 0


# -- the registry of games ---------------------------------------------------------
GAMES: Registry[Callable[[], Game]] = Registry("game")
"""Game name -> its class (built with no arguments); `make_game` builds and caches. A new game registers here."""
GAMES.register("tic_tac_toe", "palaestra.mars.board_games:TicTacToe")
GAMES.register("connect_four", "palaestra.mars.board_games:ConnectFour")
GAMES.register("kuhn_poker", "palaestra.mars.poker_games:KuhnPoker")
GAMES.register("leduc_poker", "palaestra.mars.poker_games:LeducPoker")
GAMES.register("mini_hanabi", "palaestra.mars.hanabi_games:MiniHanabi")
GAMES.register("simple_hanabi", "palaestra.mars.hanabi_games:SimpleHanabi")
GAMES.register("full_hanabi", "palaestra.mars.hanabi_games:FullHanabi")
_CACHE: dict[str, Game] = {}


def make_game(name: str) -> Game:
    """The game called `name` (built once per process); an unknown name lists the known ones."""
    if name not in GAMES:
        raise ValueError(GAMES.unknown_message(name))
    if name not in _CACHE:
        _CACHE[name] = GAMES.get(name)()
    return _CACHE[name]
