"""One conformance suite that every available LLM backend passes (LangChain standard-tests style).

Backends: ``transformers`` on `tiny`; ``openai`` against ``palaestra serve tiny``; ``vllm`` on `tiny` (vLLM on
CPU or GPU: the session's `vllm_tiny` engine, ``vllm`` marker).
"""

import math

import pytest

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client

PROMPTS = ["Hello world", "The capital of France is", "1 2 3"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture(
    scope="module",
    params=[
        "transformers",
        pytest.param("openai", marks=pytest.mark.server),
        pytest.param("vllm", marks=pytest.mark.vllm),
    ],
)
def client(request):
    if request.param == "transformers":
        return request.getfixturevalue("tiny_llm")
    if request.param == "openai":
        url = request.getfixturevalue("tiny_server")
        return make_client(LLMConfig(backend="openai", model="tiny", base_url=url, max_retries=0))
    return request.getfixturevalue("vllm_tiny")


def _end_ids(client) -> set[int]:
    tok = client.tokenizer
    return {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}


def test_shapes_and_n(client):
    outs = client.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=8, n=2, seed=0))
    assert len(outs) == len(PROMPTS) * 2
    for k, out in enumerate(outs):
        expected_prompt = client.tokenizer.encode(PROMPTS[k // 2], add_special_tokens=False)
        assert out.prompt_token_ids == expected_prompt
        assert 1 <= len(out.token_ids) <= 8
        assert len(out.logprobs) == len(out.token_ids)
        assert all(isinstance(t, int) for t in out.token_ids)
        assert out.finish_reason in ("stop", "length")
    # n samples of one prompt are separate samples (a random 1.8k-token model repeats a sequence of 8 ~never)
    assert outs[0].token_ids != outs[1].token_ids or outs[2].token_ids != outs[3].token_ids


def test_token_ids_decode_to_text(client):
    outs = client.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=12, seed=1))
    for out in outs:
        ids = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] in _end_ids(client) else out.token_ids
        assert client.tokenizer.decode(ids) == out.text


def test_logprobs_finite_and_not_positive(client):
    outs = client.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=10, seed=2))
    for out in outs:
        assert all(math.isfinite(x) and x <= 1e-6 for x in out.logprobs)
    # greedy picks the most likely token: its logprob is at least -log(vocab)
    greedy = client.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10))
    floor = -math.log(len(client.tokenizer)) - 1e-3
    assert all(x >= floor for out in greedy for x in out.logprobs)


def test_greedy_is_deterministic(client):
    params = SamplingParams(temperature=0, max_tokens=16)
    a, b = client.generate(PROMPTS, params), client.generate(PROMPTS, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]


def test_seed_reproducibility(client):
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, seed=123)
    a, b = client.generate(PROMPTS, params), client.generate(PROMPTS, params)
    c = client.generate(PROMPTS, SamplingParams(temperature=1.0, top_p=0.95, max_tokens=16, seed=321))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_stop_strings(client):
    base = client.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=24))[0]
    stop = base.text[6:9]
    assert len(stop) == 3
    out = client.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=24, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert stop not in client.tokenizer.decode(out.token_ids[:-1])
    assert out.token_ids == base.token_ids[: len(out.token_ids)]
    assert base.text.startswith(out.text.removesuffix(stop))
    assert len(out.token_ids) < len(base.token_ids)


def test_max_tokens_and_finish_reason(client):
    outs = client.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=5))
    for out in outs:
        ended = out.token_ids[-1] in _end_ids(client)
        assert len(out.token_ids) == 5 or ended
        assert out.finish_reason == ("stop" if ended else "length")


def test_chat_with_tools_renders_and_generates(client):
    conversations = [
        [{"role": "user", "content": "What is the weather in Paris?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "And in Oslo?"},
        ],
    ]
    outs = client.chat(conversations, SamplingParams(temperature=0, max_tokens=6), tools=TOOLS)
    assert len(outs) == 2
    for conv, out in zip(conversations, outs):
        assert out.prompt_token_ids == client.render(conv, tools=TOOLS)
        prompt = client.tokenizer.decode(out.prompt_token_ids)
        assert "<tools>" in prompt and '"name": "get_weather"' in prompt and conv[-1]["content"] in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        assert 1 <= len(out.token_ids) <= 6 and len(out.logprobs) == len(out.token_ids)
    # the chat path equals rendering then generating from token ids
    again = client.generate([out.prompt_token_ids for out in outs], SamplingParams(temperature=0, max_tokens=6))
    assert [x.token_ids for x in again] == [x.token_ids for x in outs]


def test_top_k_one_equals_greedy(client):
    """top_k reaches the sampler (over the OpenAI backend as vLLM's extra body field): k=1 at T=1 is greedy."""
    prompts = ["Once upon a time", "1 2 3"]
    greedy = client.generate(prompts, SamplingParams(temperature=0, max_tokens=8))
    top1 = client.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_tokens=8, seed=11))
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]
