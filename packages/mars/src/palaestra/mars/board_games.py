"""Board games (tic-tac-toe, Connect Four): marks X and O, the board shown in full to both seats.

The measured facts (``mean_moves``, ``mean_legal_moves``, ``mcts_seconds``) are described in
`palaestra.mars.eval_cost`.
"""

from __future__ import annotations

import pyspiel

from palaestra.mars.games import Game, GameKind

MARKS = ("X", "O")


def _board_rows(state: pyspiel.State) -> list[str]:
    table = str.maketrans({".": "_", "x": "X", "o": "O"})
    return [line.translate(table) for line in str(state).strip().splitlines()]


class BoardGame(Game):
    """A two-player board game with marks X and O: the seats' information, the board as lines of text, the
    format loss of the board games (lose + penalty). A subclass states its board, its choice and its action form."""

    kind = GameKind.board

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
    name = openspiel_name = "tic_tac_toe"
    title = "tic-tac-toe"
    mean_moves, mean_legal_moves = 7.7, 5.6
    mcts_seconds = {100: 0.016, 1000: 0.088}
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
    name = openspiel_name = "connect_four"
    title = "Connect Four"
    mean_moves, mean_legal_moves = 22.0, 6.7
    mcts_seconds = {100: 0.062, 1000: 0.56}
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
