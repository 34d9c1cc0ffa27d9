"""Streamed text of ``palaestra serve``: one choice's tokens, as they are generated, become text pieces.

A piece never needs taking back: one that ends in an incomplete UTF-8 character
waits for the next token, and the generated completion's own text (which
`TextStream.rest` reconciles with) has the last word after an end-of-turn token
or a stop string.
"""

from __future__ import annotations


class TextStream:
    """One choice's text as its tokens arrive: each `push` returns the new text that is settled.

    Decodes a short window (the tokens since the last settled piece, plus the
    ones before as context, as text-generation-inference does) so the cost per
    token stays constant; a piece ending in U+FFFD (an incomplete UTF-8
    character) waits. After an end-of-turn token or a stop string the stream is
    done: the generated completion's own text, which `rest` reconciles with,
    has the last word.
    """

    def __init__(self, tokenizer, end_ids: list[int], stops: list[str]) -> None:
        self.tokenizer, self.end_ids, self.stops = tokenizer, set(end_ids), stops
        self.tokens: list[int] = []
        self.prefix = self.read = 0
        self.text = ""
        self.done = False

    def push(self, token: int) -> str:
        if self.done:
            return ""
        if token in self.end_ids:
            self.done = True
            return ""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self.prefix : self.read])
        after = self.tokenizer.decode(self.tokens[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        piece = after[len(before) :]
        self.prefix, self.read = self.read, len(self.tokens)
        self.text += piece
        if any(s in self.text for s in self.stops):
            self.done = True  # the completion cuts after the stop string: `rest` sends what is left of it
            self.text = self.text[: len(self.text) - len(piece)]
            return ""
        return piece

    def rest(self, final_text: str) -> str:
        """What of the completion's text was not sent yet ("" if the stream diverged, which decoding never should)."""
        return final_text[len(self.text) :] if final_text.startswith(self.text) else ""
