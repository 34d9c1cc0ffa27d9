"""The MARS games: OpenSpiel games described in text, as the MARS code prompts them.

Each `Game` wraps one OpenSpiel game (``pyspiel``) and knows how to talk about
it: the system prompt ("You are an AI agent that makes optimal decisions to
win in the game of ..."), the GAME RULES and PLAYER INFORMATION sections, how a
state looks to one player (GAME STATE), and the action strings (``<X(0,0)>``,
``<BET>``, ``<Play card 0>``). The game logic is OpenSpiel's, never ours.

Training games: ``tic_tac_toe``, ``kuhn_poker``, ``mini_hanabi``; held out:
``connect_four``, ``leduc_poker``, ``simple_hanabi``, ``full_hanabi``.

>>> game = make_game("tic_tac_toe")
>>> state = game.new_initial_state()
>>> game.legal_action_strings(state)[:3]
['<X(0,0)>', '<X(0,1)>', '<X(0,2)>']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyspiel

from palaestra.shared.registry import Registry

KIND_BOARD, KIND_POKER, KIND_HANABI = "board", "poker", "hanabi"


@dataclass
class Game:
    """One OpenSpiel game and its text interface; subclasses render states and actions."""

    name: str
    openspiel_name: str
    kind: str
    """board (opponent moves seen in the full state) | poker | hanabi (opponent moves shown as actions)."""
    title: str
    """How the system prompt names the game."""
    params: dict[str, Any] = field(default_factory=dict)
    cooperative: bool = False
    """True for Hanabi: both seats share the score and are scored in self-play."""

    def __post_init__(self) -> None:
        self.openspiel = pyspiel.load_game(self.openspiel_name, dict(self.params))

    # -- the game -----------------------------------------------------------
    @property
    def num_players(self) -> int:
        return self.openspiel.num_players()

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

    def format_loss(self, state: pyspiel.State, player: int, penalty: float) -> float:
        """Reward to `player` whose response broke the format (MARS: -1-10 board, -bet-10 poker, -score-10 Hanabi)."""
        raise NotImplementedError

    def pays_draw_bonus(self, final_return: float, last_step_reward: float) -> bool:
        """Whether a seat gets the draw bonus at the end of the game (MARS's env code: board games on a 0 return;
        poker never, a Leduc split pot included; Hanabi when the last step's reward is 0)."""
        return final_return == 0


# -- board games -----------------------------------------------------------------
MARKS = ("X", "O")


def _board_rows(state: pyspiel.State) -> list[str]:
    table = str.maketrans({".": "_", "x": "X", "o": "O"})
    return [line.translate(table) for line in str(state).strip().splitlines()]


class BoardGame(Game):
    """A two-player board game with marks X and O: the seats' information, the board as lines of text, the
    format loss of the board games (lose + penalty). A subclass states its board, its choice and its action form."""

    board_text = ""
    """How PLAYER INFORMATION describes the game state (the board's lines)."""
    choice_text = ""
    """What a move chooses."""
    action_text = ""
    """How a legal action is written, ``{mark}`` standing for the seat's mark."""

    def player_information(self, player):
        return f"You are player_{player}. Your mark is {MARKS[player]}; your opponent's mark is {MARKS[1 - player]}."

    def full_player_information(self, player):
        mark, other = MARKS[player], MARKS[1 - player]
        return (
            f"1. You play the mark {mark}; the other player plays the mark {other}.\n"
            "2. In each of your turns:\n"
            f"   a. The game state is {self.board_text}: 'X' and 'O' are the two players' marks, '_' is an "
            "empty cell.\n"
            f"   b. {self.choice_text}\n"
            f"   c. Each legal action is written {self.action_text.format(mark=mark)}"
        )

    def render_state(self, state, player):
        return "\n".join(_board_rows(state))  # MARS's lines of text; PLAYER INFORMATION explains them

    def format_loss(self, state, player, penalty):
        return -1.0 - penalty


class TicTacToe(BoardGame):
    board_text = "the board as three lines of text"
    choice_text = "Choose an empty cell for your mark from the game state and the history of your decisions."
    action_text = (
        "<{mark}({{row}},{{column}})>: your mark {mark}, then the row and the column of the cell, both integers."
    )

    def action_string(self, state, player, action):
        return f"<{MARKS[player]}({action // 3},{action % 3})>"

    def rules(self):
        return (
            "1. Tic-tac-toe is a two-player board game played on a three-by-three grid. The grid is 0-indexed, "
            "where (0,0) is the top-left corner and (2,2) is the bottom-right corner.\n"
            "2. Two players take turns placing their marks X and O in empty cells of the grid. X moves first.\n"
            "3. The player who first places three of their marks in a horizontal, vertical, or diagonal line wins.\n"
            "4. If all cells are filled and no player wins, the game ends in a draw."
        )

    def example_action(self, player):
        return f"<{MARKS[player]}(0,0)>"


class ConnectFour(BoardGame):
    board_text = "the 6 x 7 board, top row first"
    choice_text = "Choose a column to drop your mark into, from 0 (the leftmost) to 6 (the rightmost)."
    action_text = "<{mark}({{column}})>: your mark {mark}, then the column number."

    def action_string(self, state, player, action):
        return f"<{MARKS[player]}({action})>"

    def rules(self):
        return (
            "1. Connect Four is a two-player board game played on a grid of 6 rows and 7 columns. Columns are "
            "0-indexed from left (0) to right (6); row 0 is the top row.\n"
            "2. Two players take turns dropping their marks X and O into a column that is not full; the mark falls "
            "to the lowest empty cell of that column. X moves first.\n"
            "3. The player who first connects four of their marks in a horizontal, vertical, or diagonal line wins.\n"
            "4. If the grid is full and no player wins, the game ends in a draw."
        )

    def example_action(self, player):
        return f"<{MARKS[player]}(3)>"


# -- poker -------------------------------------------------------------------------
def _moves(state: pyspiel.State) -> list[tuple[int, int]]:
    """(player, action) of every non-chance move so far."""
    return [(pa.player, pa.action) for pa in state.full_history() if pa.player >= 0]


class PokerGame(Game):
    """A two-player poker game: the seats' full information (what the state shows, what a move chooses, the
    actions), a format loss of the offender's bet + penalty, no draw bonus (a split pot included)."""

    ACTIONS: tuple[str, ...] = ()
    state_text = ""
    """What the game state shows (PLAYER INFORMATION, full prompt)."""
    choice_text = ""
    """What a move is chosen from."""

    def full_player_information(self, player):
        actions = " and ".join([", ".join(self.ACTIONS[:-1]), self.ACTIONS[-1]])
        return (
            f"1. You are player_{player}; the other player is player_{1 - player}.\n"
            "2. In each of your turns:\n"
            f"   a. The game state shows {self.state_text}.\n"
            f"   b. Choose an action from {self.choice_text} and the game state.\n"
            f"   c. The legal actions are written {actions}."
        )

    def contribution(self, state, player) -> int:
        raise NotImplementedError

    def format_loss(self, state, player, penalty):
        return -float(self.contribution(state, player)) - penalty

    def pays_draw_bonus(self, final_return, last_step_reward):
        return False


class KuhnPoker(PokerGame):
    CARDS = ("J", "Q", "K")
    ACTIONS = ("<PASS>", "<BET>")
    state_text = "your private card and the betting so far"
    choice_text = "your card"

    def action_string(self, state, player, action):
        return self.ACTIONS[action]

    def rules(self):
        return (
            "1. Kuhn poker is a two-player card game. The deck has three cards: Jack (J), Queen (Q) and King (K), "
            "ranked K > Q > J.\n"
            "2. Each player antes 1 chip into the pot and is dealt one private card; the third card is unseen.\n"
            "3. Players act in turn, player_0 first. A player can choose to:\n"
            "    a. <PASS>: check if no bet is pending, otherwise fold (the other player wins the pot).\n"
            "    b. <BET>: put 1 more chip into the pot, or call a pending bet.\n"
            "4. If both players pass, or one bets and the other calls, the higher card wins the pot (showdown).\n"
            "5. Your payoff is the chips you win minus the chips you put in."
        )

    def player_information(self, player):
        return (
            f"You are player_{player}. You are competing with player_{1 - player}.\n"
            "In each of your turns the game state shows your private card and the betting so far."
        )

    def example_action(self, player):
        return "<PASS>"

    def contribution(self, state, player) -> int:
        return 1 + sum(1 for p, a in _moves(state) if p == player and a == 1)

    def render_state(self, state, player):
        card = self.CARDS[state.history()[player]]
        lines = [f"Your card: {card}.", "Betting so far:"]
        moves = _moves(state)
        lines += [f"    player_{p}: {self.ACTIONS[a]}" for p, a in moves] or ["    (none)"]
        pot = self.contribution(state, 0) + self.contribution(state, 1)
        lines.append(f"Pot: {pot} chips; you have put in {self.contribution(state, player)}.")
        return "\n".join(lines)


class LeducPoker(PokerGame):
    RANKS = ("J", "Q", "K")
    ACTIONS = ("<FOLD>", "<CALL>", "<RAISE>")
    state_text = "your private card, the public card once it is revealed, and the betting so far"
    choice_text = "your cards"

    def action_string(self, state, player, action):
        return self.ACTIONS[action]

    def rules(self):
        return (
            "1. Leduc poker is a two-player card game. The deck includes only six cards: two each of King (K), "
            "Queen (Q), and Jack (J).\n"
            "2. At the start of each game, both player_0 and player_1 place 1 chip into the pot as a blind ante.\n"
            "3. Each player is dealt one private card, and the remaining cards are set aside unseen.\n"
            "4. The game has two betting rounds. When the first round ends, one public card from the remaining "
            "cards of the deck is revealed to both players.\n"
            "5. The two players take turns acting in the betting rounds, both starting with player_0. A player can "
            "choose to:\n"
            "    a. <FOLD>: stop betting and the other player wins the pot.\n"
            "    b. <CALL>: match the current bet. If no bet has been made, this is equivalent to checking.\n"
            "    c. <RAISE>: add n chips to the current bet, where n=2 in the first round and n=4 in the second.\n"
            "6. A maximum of two <RAISE>s are allowed in each round. The round ends when both players have acted "
            "and their bets are equal.\n"
            "7. If neither player folds, the second round ends with a showdown: a player whose private card pairs "
            "the public card wins; otherwise the higher card (K > Q > J) wins; equal cards split the pot."
        )

    def player_information(self, player):
        return (
            f"You are player_{player}. You are competing with player_{1 - player}.\n"
            "In each of your turns the game state shows your private card, the public card (if revealed), and "
            "the betting history."
        )

    def example_action(self, player):
        return "<CALL>"

    def contribution(self, state, player) -> int:
        return int(round(100 - state.money()[player]))

    def render_state(self, state, player):
        deals = [pa.action for pa in state.full_history() if pa.player < 0]
        lines = [f"Your card: {self.RANKS[deals[player] // 2]}."]
        if len(deals) > 2:
            lines.append(f"Public card: {self.RANKS[deals[2] // 2]}.")
        else:
            lines.append("Public card: not revealed yet.")
        rounds: list[list[str]] = [[]]
        for pa in state.full_history()[2:]:
            if pa.player < 0:
                rounds.append([])
            else:
                rounds[-1].append(f"player_{pa.player} {self.ACTIONS[pa.action]}")
        for i, moves in enumerate(rounds, start=1):
            lines.append(f"Round {i} betting: {', '.join(moves) if moves else '(none)'}.")
        pot = self.contribution(state, 0) + self.contribution(state, 1)
        lines.append(f"Pot: {pot} chips; you have put in {self.contribution(state, player)}.")
        return "\n".join(lines)


# -- Hanabi ------------------------------------------------------------------------
COLOR_NAMES = ("Red (R)", "Yellow (Y)", "Green (G)", "White (W)", "Blue (B)")


class Hanabi(Game):
    def action_string(self, state, player, action):
        text = state.action_to_string(player, action)  # e.g. "(Play 0)", "(Reveal player +1 color R)"
        text = text.replace("(", "<").replace(")", ">")
        return text.replace("<Play ", "<Play card ").replace("<Discard ", "<Discard card ")

    def rules(self):
        c, r = self.params["colors"], self.params["ranks"]
        hand, life = self.params["hand_size"], self.params["max_life_tokens"]
        info = self.params["max_information_tokens"]
        per_color = 3 + 2 * (r - 2) + 1 if r > 1 else 3
        return (
            "1. Hanabi is a cooperative card game for 2 players, player_0 and player_1.\n"
            f"2. The deck has {c} colors: {', '.join(COLOR_NAMES[:c])}, with ranks from 1 to {r}; each color has "
            f"{per_color} cards (three of rank 1, two of each middle rank, one of rank {r}).\n"
            f"3. Each player holds {hand} cards. Players see the other player's hand, but not their own.\n"
            f"4. There are {info} information tokens and {life} life tokens shared by both players.\n"
            f"5. The goal is to play cards in ascending rank, from 1 to {r}, onto the stack of their color.\n"
            "6. On a turn a player takes one action:\n"
            "    a. <Play card i>: play the i-th card of your own hand (0-indexed). If it is the next rank of its "
            "color stack, it is added and the team scores 1 point; otherwise a life token is lost.\n"
            "    b. <Discard card i>: discard the i-th card of your own hand and regain one information token.\n"
            "    c. <Reveal player +1 color c>: spend an information token to reveal all cards of color c in the "
            "other player's hand.\n"
            "    d. <Reveal player +1 rank r>: spend an information token to reveal all cards of rank r in the "
            "other player's hand.\n"
            "7. After playing or discarding, the player draws a new card (if the deck is not empty).\n"
            f"8. The game ends when all stacks are complete (the maximum score, {c * r}), when the deck runs out "
            "(score: the sum of the stack tops), or when all life tokens are lost (score 0: the points earned so "
            "far are lost)."
        )

    def player_information(self, player):
        return (
            f"You are player_{player}; your teammate is player_{1 - player}.\n"
            "In each of your turns the game state shows the life and information tokens, the fireworks (top card "
            "of each color stack, rank 0 meaning empty), your teammate's hand, what is known about your own cards, "
            "the deck size and the discard pile. 'R2' is a red card of rank 2; 'XX' is a card you cannot see."
        )

    def full_player_information(self, player):
        return (
            f"1. You are player_{player}; your teammate is player_{1 - player}.\n"
            "2. In each of your turns the game state gives the life and information tokens left, the color "
            "stacks, the deck size, the discard pile, your teammate's hand and what has been revealed about your "
            "own cards.\n"
            "3. A known card is written color then rank: 'R2' is a red card of rank 2; 'XX' is a card you cannot "
            "see.\n"
            "4. A color stack is shown by its top card, rank 0 meaning empty: 'Y0' is an empty yellow stack."
        )

    def example_action(self, player):
        return "<Discard card 0>"

    def render_state(self, state, player):
        return state.observation_string(player)

    def format_loss(self, state, player, penalty):
        return -float(state.returns()[player]) - penalty

    def pays_draw_bonus(self, final_return, last_step_reward):
        return last_step_reward == 0


# -- the registry of games ---------------------------------------------------------
def _hanabi(colors: int, ranks: int, hand: int, info: int, life: int) -> dict[str, int]:
    return {
        "players": 2,
        "colors": colors,
        "ranks": ranks,
        "hand_size": hand,
        "max_information_tokens": info,
        "max_life_tokens": life,
    }


GAMES: Registry[Callable[[], Game]] = Registry("game")
"""Game name -> factory; `make_game` builds and caches. Other games register here the same way."""
GAMES.register("tic_tac_toe", lambda: TicTacToe("tic_tac_toe", "tic_tac_toe", KIND_BOARD, "tic-tac-toe"))
GAMES.register("connect_four", lambda: ConnectFour("connect_four", "connect_four", KIND_BOARD, "Connect Four"))
GAMES.register("kuhn_poker", lambda: KuhnPoker("kuhn_poker", "kuhn_poker", KIND_POKER, "Kuhn Poker"))
GAMES.register("leduc_poker", lambda: LeducPoker("leduc_poker", "leduc_poker", KIND_POKER, "Leduc Poker"))
GAMES.register(
    "mini_hanabi", lambda: Hanabi("mini_hanabi", "hanabi", KIND_HANABI, "Hanabi", _hanabi(2, 2, 3, 3, 3), True)
)
GAMES.register(
    "simple_hanabi", lambda: Hanabi("simple_hanabi", "hanabi", KIND_HANABI, "Hanabi", _hanabi(3, 2, 5, 8, 3), True)
)
GAMES.register(
    "full_hanabi", lambda: Hanabi("full_hanabi", "hanabi", KIND_HANABI, "Hanabi", _hanabi(3, 3, 5, 8, 3), True)
)
TRAINING_GAMES = ("tic_tac_toe", "kuhn_poker", "mini_hanabi")
HELD_OUT_GAMES = ("connect_four", "leduc_poker", "simple_hanabi", "full_hanabi")
_CACHE: dict[str, Game] = {}


def make_game(name: str) -> Game:
    """The game called `name` (built once per process); an unknown name lists the known ones."""
    if name not in GAMES:
        raise ValueError(GAMES.unknown_message(name))
    if name not in _CACHE:
        _CACHE[name] = GAMES.get(name)()
    return _CACHE[name]
