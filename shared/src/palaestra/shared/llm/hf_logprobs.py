"""Log-probs of ``model.generate``'s samples (the transformers backend's ``llm.hf_generate: true`` path).

`LogprobRecorder` is a logits processor that keeps each step's logits and scores the chosen tokens once they are
known. First in the processor list it sees the raw logits (``llm.logprobs_mode: raw``). For ``processed`` the
backend puts `Warp` (HF's temperature, top-k, top-p as hf_decode's `filter_logits`) ahead of it and leaves
generate's own warpers off: the recorder then scores the distribution each token is drawn from.
"""

from __future__ import annotations

from typing import cast

import torch
from transformers import LogitsProcessor

from palaestra.shared.llm.base import SamplingParams
from palaestra.shared.llm.hf_decode import filter_logits


class LogprobRecorder(LogitsProcessor):
    """Records log p(token) of each sampled token from the raw logits (placed first in the processor list).

    Each step's logits are only kept (generate hands every step a fresh float32 copy, and the warpers after us
    return new tensors); they are scored in one vectorized pass (gather - logsumexp) once the chosen tokens are
    known: at the end, or earlier when the kept logits exceed `budget_bytes`. Per step this costs a list append,
    and memory stays bounded, unlike HF's ``output_logits`` (batch x steps x vocab).
    """

    def __init__(self, budget_bytes: int = 256 << 20, top_k: int = 0) -> None:
        self.budget_elements = budget_bytes // 4
        self.top_k = top_k
        self.pending: list[torch.Tensor] = []
        self.scored: list[torch.Tensor] = []
        self.top: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, logprobs), each [batch, count, k]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.pending.append(scores)
        if len(self.pending) > 1 and len(self.pending) * scores.numel() > self.budget_elements:
            done = len(self.pending) - 1  # the tokens chosen from these are the last `done` inputs
            self._score(input_ids[:, -done:], done)
        return scores

    def _score(self, chosen: torch.Tensor, count: int) -> None:
        logits = torch.stack(self.pending[:count], dim=1).float()  # [batch, count, vocab]
        picked = logits.gather(2, chosen[:, :, None]).squeeze(2)
        lse = torch.logsumexp(logits, dim=-1)
        self.scored.append(picked - lse)
        if self.top_k:
            values, ids = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1)
            self.top.append((ids, values - lse[:, :, None]))
        del self.pending[:count]

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[batch, generated] logprobs, given the final sequences."""
        if self.pending:
            self._score(sequences[:, -len(self.pending) :], len(self.pending))
        if not self.scored:
            return sequences.new_zeros((sequences.shape[0], 0)).float()
        return torch.cat(self.scored, dim=1)

    def top_logprobs(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """[batch, generated, k] ids and logprobs of the k most likely tokens (after `finish`)."""
        if not self.top:
            return None
        return torch.cat([i for i, _ in self.top], dim=1), torch.cat([v for _, v in self.top], dim=1)


class Warp(LogitsProcessor):
    """HF's warpers (`filter_logits`) ahead of the recorder, which then scores what is sampled (processed)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        p = self.params
        return cast(torch.FloatTensor, filter_logits(scores, p.temperature, p.top_k, p.top_p))
