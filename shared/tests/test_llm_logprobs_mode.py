"""``llm.logprobs_mode``: each sampled token's log-prob under the raw logits, or under the distribution it was drawn
from (tempered, top-k / top-p truncated, renormalized), on both transformers paths (the decode loop and
``model.generate``), against a closed form recomputed from the model's logits of each prefix (a full forward, no
cache), written from the rule's text: keep the k largest logits, then, in descending probability, every token
whose more likely tokens hold less than top_p of the mass. Negative control: under T != 1 the raw log-probs are
not the processed ones (and they equal the raw closed form)."""

import math

import pytest
import torch

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
from palaestra.shared.llm.base import LogprobsMode
from palaestra.shared.llm.vllm_backend import vllm_logprobs_mode

PROMPTS = ["Hello world", "1 2 3", "Once upon a time"]


def closed_form(logits: torch.Tensor, token: int, temperature: float, top_k: int, top_p: float) -> float:
    """log p(token) under the processed distribution of one step's raw `logits` [vocab] (float64)."""
    z = logits.double() / temperature
    probs = torch.softmax(z, dim=-1)
    order = sorted(range(len(z)), key=lambda i: -float(z[i]))
    kept = set(order[:top_k]) if top_k else set(order)
    if top_k:  # ties at the k-th value are kept, as HF's warper does
        kth = float(z[order[top_k - 1]])
        kept |= {i for i in order if float(z[i]) == kth}
    kept_order = [i for i in order if i in kept]
    mass = torch.softmax(z[kept_order], dim=-1)  # renormalized over top-k, then top-p on that
    before, nucleus = 0.0, []
    for i, p in zip(kept_order, mass.tolist()):
        if before < top_p:
            nucleus.append(i)
        before += p
    if token not in nucleus:
        return -math.inf
    return float(torch.log(probs[token] / probs[nucleus].sum()))


def raw_form(logits: torch.Tensor, token: int) -> float:
    return float(torch.log_softmax(logits.double(), dim=-1)[token])


def prefix_logits(model, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """The raw logits before each generated token, from a full forward over prompt + tokens."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return [logits[len(prompt) - 1 + j] for j in range(len(tokens))]


@pytest.fixture(scope="module")
def clients():
    torch.set_num_threads(1)
    made = {}
    for mode in LogprobsMode:
        for hf_generate in (False, True):
            made[mode, hf_generate] = make_client(
                LLMConfig(model="tiny", device="cpu", dtype="float32", logprobs_mode=mode, hf_generate=hf_generate)
            )
    return made


SETTINGS = [(0.7, 0, 1.0), (1.3, 20, 1.0), (0.8, 0, 0.9), (0.6, 30, 0.8)]


@pytest.mark.parametrize("hf_generate", [False, True], ids=["decode_loop", "generate"])
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_processed_logprobs_are_those_of_the_distribution_sampled_from(clients, hf_generate, temperature, top_k, top_p):
    client = clients[LogprobsMode.processed, hf_generate]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=6, n=2, seed=5)
    checked = 0
    for c in client.generate(PROMPTS, params):
        for logits, token, logged in zip(
            prefix_logits(client.model, c.prompt_token_ids, c.token_ids), c.token_ids, c.logprobs
        ):
            expected = closed_form(logits, token, temperature, top_k, top_p)
            assert math.isfinite(expected), "a token outside the kept set was sampled"
            assert logged == pytest.approx(expected, abs=2e-4)
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize("hf_generate", [False, True], ids=["decode_loop", "generate"])
def test_raw_logprobs_differ_from_processed_under_temperature(clients, hf_generate):
    """Negative control: the same samples (same seed) scored both ways; raw is the untempered log-softmax."""
    params = SamplingParams(temperature=0.5, top_k=10, top_p=0.9, max_tokens=6, seed=7)
    raw = clients[LogprobsMode.raw, hf_generate].generate(PROMPTS, params)
    processed = clients[LogprobsMode.processed, hf_generate].generate(PROMPTS, params)
    assert [c.token_ids for c in raw] == [c.token_ids for c in processed]  # the mode changes what is logged only
    model = clients[LogprobsMode.raw, hf_generate].model
    gaps = []
    for r, p in zip(raw, processed):
        for logits, token, lr, lp in zip(
            prefix_logits(model, r.prompt_token_ids, r.token_ids), r.token_ids, r.logprobs, p.logprobs
        ):
            assert lr == pytest.approx(raw_form(logits, token), abs=2e-4)
            gaps.append(abs(lr - lp))
    assert max(gaps) > 0.05


def test_at_temperature_one_without_truncation_the_modes_agree(clients):
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    raw = clients[LogprobsMode.raw, False].generate(PROMPTS, params)
    processed = clients[LogprobsMode.processed, False].generate(PROMPTS, params)
    for r, p in zip(raw, processed):
        assert r.token_ids == p.token_ids
        assert r.logprobs == pytest.approx(p.logprobs, abs=1e-5)


def test_vllm_engine_modes():
    assert vllm_logprobs_mode(LLMConfig(logprobs_mode=LogprobsMode.raw)) == "raw_logprobs"
    assert vllm_logprobs_mode(LLMConfig(logprobs_mode=LogprobsMode.processed)) == "processed_logprobs"
