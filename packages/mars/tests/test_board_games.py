"""Tic-tac-toe and Connect Four share one board-game class; each still writes MARS's text for its board."""

from palaestra.mars.games import GAMES


def test_board_games_player_information_text():
    ttt, c4 = GAMES.get("tic_tac_toe")(), GAMES.get("connect_four")()
    assert ttt.full_player_information(1) == (
        "1. You play the mark O; the other player plays the mark X.\n"
        "2. In each of your turns:\n"
        "   a. The game state is the board as three lines of text: 'X' and 'O' are the two players' marks, '_' is an "
        "empty cell.\n"
        "   b. Choose an empty cell for your mark from the game state and the history of your decisions.\n"
        "   c. Each legal action is written <O({row},{column})>: your mark O, then the row and the column of the cell, "
        "both integers."
    )
    assert c4.full_player_information(0) == (
        "1. You play the mark X; the other player plays the mark O.\n"
        "2. In each of your turns:\n"
        "   a. The game state is the 6 x 7 board, top row first: 'X' and 'O' are the two players' marks, '_' is an "
        "empty cell.\n"
        "   b. Choose a column to drop your mark into, from 0 (the leftmost) to 6 (the rightmost).\n"
        "   c. Each legal action is written <X({column})>: your mark X, then the column number."
    )
    assert ttt.player_information(0) == "You are player_0. Your mark is X; your opponent's mark is O."
    state = c4.new_initial_state()
    state.apply_action(3)
    assert c4.render_state(state, 1).splitlines() == ["_______"] * 5 + ["___X___"]
    assert ttt.format_loss(state, 0, 10.0) == c4.format_loss(state, 0, 10.0) == -11.0
    assert c4.legal_action_strings(state)[:2] == ["<O(0)>", "<O(1)>"]


def test_poker_games_player_information_text_and_format_loss():
    """Kuhn and Leduc share one poker class; each keeps its own text; a format loss costs the offender's bet + the
    penalty (MARS: -bet - 10), never a draw bonus."""
    kuhn, leduc = GAMES.get("kuhn_poker")(), GAMES.get("leduc_poker")()
    assert kuhn.full_player_information(0) == (
        "1. You are player_0; the other player is player_1.\n"
        "2. In each of your turns:\n"
        "   a. The game state shows your private card and the betting so far.\n"
        "   b. Choose an action from your card and the game state.\n"
        "   c. The legal actions are written <PASS> and <BET>."
    )
    assert leduc.full_player_information(1).endswith(
        "   a. The game state shows your private card, the public card once it is revealed, and the betting so far.\n"
        "   b. Choose an action from your cards and the game state.\n"
        "   c. The legal actions are written <FOLD>, <CALL> and <RAISE>."
    )
    state = kuhn.new_initial_state()
    state.apply_action(0)  # deal J, then Q
    state.apply_action(1)
    state.apply_action(1)  # player 0 bets: 1 ante + 1
    assert kuhn.format_loss(state, 0, 10.0) == -12.0 and kuhn.format_loss(state, 1, 10.0) == -11.0
    assert leduc.format_loss(leduc.new_initial_state(), 0, 10.0) == -11.0  # the ante only
    assert not kuhn.pays_draw_bonus(0.0, 0.0) and not leduc.pays_draw_bonus(0.0, 0.0)
