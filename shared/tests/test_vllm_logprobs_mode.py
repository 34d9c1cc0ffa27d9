"""vLLM's processed log-probs (``llm.logprobs_mode: processed`` -> the engine's ``processed_logprobs``): each sampled
token's log-prob is that of the tempered, top-k / top-p truncated distribution, checked against the closed form of
test_llm_logprobs_mode.py on the transformers model with the same weights (`tiny`, float32). Negative control: the
raw log-softmax of the same logits differs. In ``make test``'s vLLM stage (``.venv-vllm``)."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
from palaestra.shared.testing import tiny_learner

pytestmark = pytest.mark.vllm

spec = importlib.util.spec_from_file_location("logprobs_mode", Path(__file__).with_name("test_llm_logprobs_mode.py"))
forms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(forms)


def test_vllm_processed_logprobs_are_those_of_the_distribution_sampled_from():
    pytest.importorskip("vllm")
    client = make_client(
        LLMConfig(backend="vllm", model="tiny", dtype="float32", gpu_memory_utilization=0.2, logprobs_mode="processed")
    )
    model = tiny_learner().model
    try:
        temperature, top_k, top_p = 0.7, 20, 0.9
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=6, n=2, seed=1)
        gaps, checked = [], 0
        for c in client.generate(forms.PROMPTS, params):
            steps = forms.prefix_logits(model, c.prompt_token_ids, c.token_ids)
            for logits, token, logged in zip(steps, c.token_ids, c.logprobs):
                expected = forms.closed_form(logits, token, temperature, top_k, top_p)
                assert math.isfinite(expected), "vLLM sampled a token outside the kept set"
                assert logged == pytest.approx(expected, abs=1e-3)
                gaps.append(abs(logged - forms.raw_form(logits, token)))
                checked += 1
        assert checked >= 12
        assert max(gaps) > 0.05  # negative control: not the raw log-probs
    finally:
        client.close()
        torch.set_num_threads(1)
