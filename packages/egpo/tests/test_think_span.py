"""The chain-of-thought span that EGPO's entropy term reads (`palaestra.shared.rl.batch`), for thinking templates.

A chat template that opens ``<think>`` in the generation prompt (Qwen3's thinking models) leaves the model's
response without an opening tag; a tokenizer without a ``<think>`` token (SmolLM2) spells it in several
tokens. In both cases the span must not come out empty, or EGPO silently becomes GRPO.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from palaestra.shared.rl.advantages import AdvantageInput, AdvantageStep, compute_advantages
from palaestra.shared.rl.batch import build_batch, think_entropy
from palaestra.shared.rollout.trajectory import Trajectory, Turn

OPEN, CLOSE = 7, 8  # single-token markers
PROMPT = [1, 2, 3]


def traj(prompt, response, reward, group="g"):
    return Trajectory("fc", "agent", group, turns=[Turn("agent", list(prompt), list(response), reward=reward)])


def expected_span(seq_ids, mask, open_seq, close_seq):
    """Independent route: find the markers in the decoded-as-string row and mark what lies between."""
    text = " ".join(f"<{t}>" for t in seq_ids)  # one "word" per token
    o, c = " ".join(f"<{t}>" for t in open_seq), " ".join(f"<{t}>" for t in close_seq)
    out = [False] * len(seq_ids)
    pos = 0
    while True:
        start = text.find(o, pos)
        if start < 0:
            break
        end = text.find(c, start)
        first = text[: start + len(o)].count("<")
        last = text[:end].count("<") if end >= 0 else len(seq_ids)
        for k in range(first, last):
            out[k] = bool(mask[k])
        pos = end if end >= 0 else len(text)
    return out


def test_prompt_that_opens_think_starts_the_span_at_the_response():
    # Qwen3 thinking: "...<|im_start|>assistant\n<think>\n" is the prompt; the model writes "reasoning</think>..."
    prompt = [*PROMPT, OPEN, 4]
    response = [20, 21, 22, CLOSE, 30, 31]
    batch = build_batch([traj(prompt, response, 1.0)], pad_id=0, think_ids=(OPEN, CLOSE))
    seq = [*prompt, *response]
    mask = [0] * len(prompt) + [1] * len(response)
    want = expected_span(seq, mask, (OPEN,), (CLOSE,))
    assert sum(want) == 3  # the three reasoning tokens
    assert batch.think_mask[0].tolist() == want[1:]  # target positions: j scores token j+1


def test_closed_think_in_the_prompt_and_multi_token_markers():
    open_seq, close_seq = (40, 41, 42), (43, 41, 42)  # "<", "think", ">" / "</", "think", ">"
    # a non-thinking template closes the block in the prompt: nothing of the response is thinking
    closed = [*PROMPT, *open_seq, 5, *close_seq]
    response = [20, 21, 30]
    b = build_batch([traj(closed, response, 1.0)], 0, (open_seq, close_seq))
    assert not b.think_mask.any()
    # the model opens and closes it itself, in several tokens each
    response = [*open_seq, 20, 21, 22, 23, *close_seq, 30]
    b = build_batch([traj(PROMPT, response, 1.0)], 0, (open_seq, close_seq))
    seq, mask = [*PROMPT, *response], [0] * 3 + [1] * len(response)
    assert b.think_mask[0].tolist() == expected_span(seq, mask, open_seq, close_seq)[1:]
    assert int(b.think_mask.sum()) == 4


def test_egpo_bonus_is_not_silently_zero_with_a_thinking_template():
    prompt = [*PROMPT, OPEN]
    trajs = [traj(prompt, [20 + i, 21, CLOSE, 30], r) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])]
    batch = build_batch(trajs, 0, (OPEN, CLOSE))
    entropy = torch.rand(batch.loss_mask.shape) + 0.5
    h = think_entropy(entropy, batch, "think")
    assert np.isfinite(h).all()
    adv_in = AdvantageInput.from_trajectories(trajs, h, think_entropy(entropy, batch, "response"))
    grpo = compute_advantages([AdvantageStep("grpo")], adv_in)
    egpo = compute_advantages(
        [AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"lam": 0.4, "alpha": 2.0})], adv_in
    )
    for a, e, hi in zip(grpo, egpo, h):  # A + λ·clip(H, -|A|/α, |A|/α), computed here by hand
        bound = abs(a[0]) / 2.0
        assert e[0] == np.float64(a[0] + 0.4 * min(max(hi, -bound), bound))
        assert e[0] != a[0]


def test_trainer_finds_multi_token_markers_when_the_tokenizer_has_no_think_token():
    from palaestra.shared.rl.policy import think_token_ids

    class NoThinkToken:  # SmolLM2's case: "<think>" is "<", "think", ">"
        unk_token_id = 0
        vocab = {"<": 40, "</": 43, "think": 41, ">": 42}

        def convert_tokens_to_ids(self, tokens):
            return [0 for _ in tokens]

        def encode(self, text, add_special_tokens=False):
            return [self.vocab["</" if text.startswith("</") else "<"], self.vocab["think"], self.vocab[">"]]

    markers = think_token_ids(NoThinkToken())
    assert markers == ((40, 41, 42), (43, 41, 42))
    response = [40, 41, 42, 20, 21, 43, 41, 42, 30]
    assert int(build_batch([traj(PROMPT, response, 1.0)], 0, markers).think_mask.sum()) == 2


def test_close_marker_merged_with_a_following_tool_call_ends_the_span():
    """SmolLM2 spells ``</think><tool_call>`` as ``</``, ``think``, ``><``, ...: the span still ends at ``</think>``
    (it used to run to the end of the response). Expected span: the tokens whose text lies between the markers,
    found on the decoded text of the real tokenizer."""
    from palaestra.shared.llm.models import load_tokenizer, resolve_model_path
    from palaestra.shared.rl.policy import think_token_ids

    tok = load_tokenizer("smollm2-135m", resolve_model_path("smollm2-135m"))
    markers = think_token_ids(tok)
    for text in ('<think>pick the tool</think><tool_call>\n{"name": "f"}', "<think>pick the tool</think>\nDone."):
        response = tok.encode(text, add_special_tokens=False)
        pieces = [tok.decode([t]) for t in response]
        assert "".join(pieces) == text
        starts = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
        lo, hi = text.index("<think>") + len("<think>"), text.index("</think>")
        want = [lo <= s and s + len(p) <= hi for s, p in zip(starts, pieces)]  # tokens inside the reasoning text
        mask = build_batch([traj(PROMPT, response, 1.0)], 0, markers).think_mask[0].tolist()
        assert mask[len(PROMPT) - 1 :] == want
        assert "".join(p for p, w in zip(pieces, want) if w) == "pick the tool"


def test_entropy_term_reports_what_it_changed():
    """The per-step log of EGPO's term: share of advantages changed, bonus size against the advantages, and the
    groups of equal rewards (advantage 0) it lifted to non-zero (none: its clip bound is |A|/α = 0 there)."""
    prompt = [*PROMPT, OPEN]
    rewards = {"a": [1.0, 0.0, 1.0, 0.0], "b": [1.0, 1.0, 1.0, 1.0]}  # group b: all equal, advantages 0
    trajs = [traj(prompt, [20 + i, 21, CLOSE, 30], r, group=g) for g, rs in rewards.items() for i, r in enumerate(rs)]
    batch = build_batch(trajs, 0, (OPEN, CLOSE))
    entropy = torch.rand(batch.loss_mask.shape) + 0.5
    h = think_entropy(entropy, batch, "think")
    adv_in = AdvantageInput.from_trajectories(trajs, h, think_entropy(entropy, batch, "response"))
    out = compute_advantages(
        [AdvantageStep("grpo"), AdvantageStep("entropy_clipped", {"lam": 0.4, "alpha": 2.0})], adv_in
    )
    # by hand: group a's advantages are ±0.5 / s, s = sqrt(1/3) the sample std of 1,0,1,0; bonus
    # 0.4 * min(h, |A| / 2); group b's stay 0
    a = 0.5 / np.sqrt(1 / 3)
    grpo = [a, -a, a, -a, 0.0, 0.0, 0.0, 0.0]
    bonus = [0.4 * min(max(hi, -abs(a) / 2), abs(a) / 2) for a, hi in zip(grpo, h)]
    assert [float(v[0]) for v in out] == pytest.approx([a + b for a, b in zip(grpo, bonus)], abs=1e-5)
    stats = adv_in.stats
    assert stats["adv/entropy_changed_share"] == 0.5  # group a's four of eight
    assert stats["adv/entropy_bonus_ratio"] == pytest.approx(sum(abs(b) for b in bonus) / (4 * a), rel=1e-4)
    assert stats["adv/entropy_zero_groups"] == 1 and stats["adv/entropy_zero_to_nonzero_groups"] == 0
