"""The lean decode loop (`hf_decode`) against transformers' own ``generate``, its warpers and a hand-written rule."""

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
from palaestra.shared.llm.hf_decode import decode, filter_logits, sample

TEXTS = ["Hello world", "The capital of France is", "1 + 1 =", "get_weather in Paris and London please", "a"]


def _hf_greedy(client, ids, mask, eos, steps):
    out = client.model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=steps,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=eos,
        pad_token_id=client.tokenizer.pad_token_id,
    )
    return out[:, ids.shape[1] :]


def test_greedy_tokens_equal_generate_with_left_padding_repeats_and_eos_mid_batch(tiny_llm):
    tok = tiny_llm.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    prompts += [prompts[1], prompts[1]]  # repeated prompts share one prefill
    assert len({len(p) for p in prompts}) > 2  # left padding of different widths
    ids, mask = tiny_llm.batch_inputs(prompts)
    free = _hf_greedy(tiny_llm, ids, mask, [tiny_llm.tokenizer.pad_token_id], 20)
    # an end token that row 0 emits at step k >= 2 (and not before) and row 2 never does: row 0 ends mid-batch
    k = next(k for k in range(2, 20) if free[0, k] not in free[0, :k] and free[0, k] not in free[2])
    eos = [int(free[0, k])]
    ref = _hf_greedy(tiny_llm, ids, mask, eos, 20)
    assert (ref[0, k + 1 :] == tok.pad_token_id).all() and ref.shape[1] == 20  # the setup does what it says
    out = decode(tiny_llm.model, ids, mask, max_new_tokens=20, eos_ids=eos, pad_id=tok.pad_token_id, temperature=0)
    assert torch.equal(out.tokens, ref)
    # log-probs: of the chosen tokens under one plain forward pass over prompt + completion
    for row, prompt in enumerate(prompts):
        n = k + 1 if row == 0 else 20
        seq = torch.tensor([prompt + ref[row, :n].tolist()])
        with torch.no_grad():
            logits = tiny_llm.model(seq).logits[0, len(prompt) - 1 : -1]
        expected = logits.log_softmax(-1).gather(1, ref[row, :n, None]).squeeze(1)
        assert torch.allclose(out.logprobs[row, :n], expected, atol=1e-4)


def test_every_row_ending_stops_the_loop(tiny_llm):
    prompts = [tiny_llm.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS[:3]]
    ids, mask = tiny_llm.batch_inputs(prompts)
    first = _hf_greedy(tiny_llm, ids, mask, [tiny_llm.tokenizer.pad_token_id], 1)[:, 0].tolist()
    out = decode(tiny_llm.model, ids, mask, max_new_tokens=10, eos_ids=first, pad_id=0, temperature=0)
    assert out.tokens.tolist() == [[t] for t in first]


def _reference_filter(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[bool]:
    """Which tokens may be drawn, by the rule written out: the k largest scaled logits (ties at the k-th kept),
    then, most likely first, each token while the probability mass of those before it is below top_p."""
    scaled = [x / temperature for x in logits]
    allowed = list(range(len(scaled)))
    if top_k:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        allowed = [i for i in allowed if scaled[i] >= kth]
    weights = {i: torch.tensor(scaled[i]).exp().item() for i in allowed}
    total = sum(weights.values())
    kept, mass = [], 0.0
    for i in sorted(allowed, key=lambda i: -scaled[i]):
        if kept and mass >= top_p:
            break
        kept.append(i)
        mass += weights[i] / total
    return [i in kept for i in range(len(scaled))]


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 5, 1.0), (0.6, 8, 0.8), (2.0, 3, 0.5)]
)
def test_filter_matches_hf_warpers_and_the_written_rule(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(6, 40) * 3
    ours = filter_logits(logits, temperature, top_k, top_p)
    hf = TemperatureLogitsWarper(temperature)(None, logits)  # type: ignore[arg-type]
    if top_k:
        hf = TopKLogitsWarper(top_k)(None, hf)  # type: ignore[arg-type]
    if top_p < 1:
        hf = TopPLogitsWarper(top_p)(None, hf)  # type: ignore[arg-type]
    assert torch.equal(ours, hf)
    for row in range(6):
        kept = _reference_filter(logits[row].tolist(), temperature, top_k, top_p)
        assert (ours[row] > float("-inf")).tolist() == kept
        assert torch.allclose(ours[row][kept], logits[row][kept] / temperature)


def test_top_p_boundary_mass_exactly_top_p_is_enough():
    # four equal tokens: two of them hold exactly 0.5; top_p 0.5 keeps two, a hair above keeps three
    logits = torch.zeros(1, 4)
    assert int((filter_logits(logits, 1.0, 0, 0.5) > float("-inf")).sum()) == 2
    assert int((filter_logits(logits, 1.0, 0, 0.5001) > float("-inf")).sum()) == 3
    assert sum(_reference_filter([0.0] * 4, 1.0, 0, 0.5)) == 2


def test_sample_draws_each_row_from_its_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, float("-inf"), -1.0], [0.0, float("-inf"), 0.0, 3.0, float("-inf")]])
    probs = logits.softmax(-1)
    torch.manual_seed(1)
    draws = 40_000
    counts = torch.zeros_like(probs)
    for _ in range(draws // 2_000):
        picked = sample(logits.repeat_interleave(2_000, 0)).view(2, 2_000)
        counts += torch.nn.functional.one_hot(picked, 5).sum(1)
    freq = counts / draws
    sigma = (probs * (1 - probs) / draws).sqrt()
    assert ((freq - probs).abs() <= 5 * sigma + 1e-9).all(), (freq, probs)
    assert (counts[probs == 0] == 0).all()  # a filtered token is never drawn
    torch.manual_seed(3)
    a = sample(logits.repeat(50, 1))
    torch.manual_seed(3)
    assert torch.equal(a, sample(logits.repeat(50, 1)))  # a fixed seed draws the same tokens


def test_client_loop_and_hf_generate_agree_on_greedy_stops_and_top_logprobs(tiny_llm):
    hf = make_client(LLMConfig(model="tiny", device="cpu", hf_generate=True))
    params = SamplingParams(temperature=0, max_tokens=14, n=2, top_logprobs=3)
    a, b = tiny_llm.generate(TEXTS, params), hf.generate(TEXTS, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.finish_reason for x in a] == [x.finish_reason for x in b]
    for x, y in zip(a, b):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)
        assert [[t for t, _ in step] for step in x.extra["top_logprobs"]] == [
            [t for t, _ in step] for step in y.extra["top_logprobs"]
        ]
    # a stop string ends the row on the token that completes it, in both paths
    text = a[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip()
    params = SamplingParams(temperature=0, max_tokens=14, stop=[stop])
    c, d = tiny_llm.generate(TEXTS[:1], params)[0], hf.generate(TEXTS[:1], params)[0]
    assert (c.text, c.token_ids, c.finish_reason) == (d.text, d.token_ids, d.finish_reason)
    assert c.text.endswith(stop) and c.finish_reason == "stop"


def test_step_hook_sees_live_rows_and_ends_the_ones_it_flags(tiny_llm):
    seen: list[tuple[list[int], list[int]]] = []

    def hook(positions, tokens):
        seen.append((positions, tokens))
        return [p == 1 and len(seen) >= 3 for p in positions]  # row 1 ends after its third token

    outs = tiny_llm.generate(TEXTS[:3], SamplingParams(temperature=0, max_tokens=8), on_step=hook)
    free = tiny_llm.generate(TEXTS[:3], SamplingParams(temperature=0, max_tokens=8))
    assert len(seen) == 8 and all(1 in positions for positions, _ in seen[:3])
    assert all(1 not in positions for positions, _ in seen[3:])  # an ended row is not stepped again
    assert [tokens[positions.index(1)] for positions, tokens in seen[:3]] == outs[1].token_ids[:3]
    assert outs[1].token_ids[:3] == free[1].token_ids[:3] and len(free[1].token_ids) > 4
    assert set(outs[1].token_ids[3:]) <= {tiny_llm.tokenizer.pad_token_id}  # ended: padding from there on
    assert [tokens[positions.index(0)] for positions, tokens in seen] == outs[0].token_ids == free[0].token_ids
