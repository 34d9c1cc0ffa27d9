"""MARS's board-game action strings as single tokens of the embedded `tiny` model.

Registered in `palaestra.shared.llm.tiny.TOKEN_SETS` (entry-point group
``palaestra.tiny_tokens``). One token per tic-tac-toe action (``<X(1,2)>``) and
Connect Four action (``<O(3)>``): a legal move is then a copy of one listed
token, not a row digit followed by the column digit of the same item (an
in-context lookup the 2M model does not learn in a CPU budget; see
``docs/experiments/``). Pretrained models keep their own tokenizers.
Kept free of heavy imports: it is imported whenever `tiny`'s tokenizer is built.
"""

from __future__ import annotations

from palaestra.shared.llm.tiny import TOKEN_SETS


@TOKEN_SETS.register("mars_board_actions")
def board_action_tokens() -> list[str]:
    """``<X(r,c)>``/``<O(r,c)>`` for tic-tac-toe's 3x3 cells, ``<X(c)>``/``<O(c)>`` for Connect Four's 7 columns."""
    cells = [f"<{m}({r},{c})>" for m in "XO" for r in range(3) for c in range(3)]
    return cells + [f"<{m}({c})>" for m in "XO" for c in range(7)]
