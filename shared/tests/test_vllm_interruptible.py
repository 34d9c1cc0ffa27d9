"""Interruptible generation on the vllm backend (llm/vllm_interrupt.py), on the session's `vllm_tiny` (`tiny`
in float32, vLLM's CPU build under ``make test``).

- with no update, the segments give the uninterrupted call's greedy tokens and log-probs;
- new weights loaded at the boundary after token j give the tokens of a reference written apart from vLLM (the
  transformers model with no cache, its weights switched before token j: `switching_reference`), each token
  tagged with the version that sampled it. Negative control: the reference that never switches differs.
"""

import dataclasses

import pytest
import torch

from palaestra.shared.llm import SamplingParams
from palaestra.shared.testing import switching_reference, two_weight_versions

pytestmark = pytest.mark.vllm

PROMPTS = ["Hello world", "1 2 3 4", "Once upon a time there was"]
SEGMENT = 4
GREEDY = SamplingParams(temperature=0, max_tokens=10)


@pytest.fixture
def segmented(vllm_tiny):
    """The session's engine generating in segments of SEGMENT tokens (its config restored after)."""
    config = vllm_tiny.config
    vllm_tiny.config = dataclasses.replace(config, vllm_segment_tokens=SEGMENT)
    yield vllm_tiny
    vllm_tiny.config = config


def test_without_an_update_the_segments_give_the_uninterrupted_tokens(segmented):
    plain = segmented.generate(PROMPTS, GREEDY)
    parts = segmented.generate(PROMPTS, GREEDY, at_boundary=lambda: 7)
    assert [c.token_ids for c in parts] == [c.token_ids for c in plain]
    assert [c.finish_reason for c in parts] == [c.finish_reason for c in plain]
    assert [c.text for c in parts] == [c.text for c in plain]
    for a, b in zip(parts, plain):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
        assert a.extra["token_versions"] == [7] * len(a.token_ids)


def test_an_update_between_segments_switches_the_weights_at_that_token(segmented):
    reference_client, old, new = two_weight_versions()
    calls: list[int] = []

    def at_boundary() -> int:  # before the first segment, then after each
        calls.append(len(calls))
        if len(calls) == 2:
            segmented.load_weights(new)
        return 0 if len(calls) < 2 else 1

    try:
        out = segmented.generate(PROMPTS, GREEDY, at_boundary=at_boundary)
    finally:
        segmented.load_weights(old)  # the session's engine is shared
    want = switching_reference(reference_client, old, new, PROMPTS, GREEDY, switch=SEGMENT)
    never = switching_reference(reference_client, old, new, PROMPTS, GREEDY, switch=None)
    assert want != never  # the update changes the tokens: the comparison has power
    assert [c.token_ids for c in out] == want
    for c in out:
        n = len(c.token_ids)
        assert c.extra["token_versions"] == [0] * min(SEGMENT, n) + [1] * max(0, n - SEGMENT)
