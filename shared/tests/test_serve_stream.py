"""Streaming (server-sent events) through the official `openai` client, and top_logprobs checked by a forward pass."""

import pytest
import torch

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
from palaestra.shared.llm.serve.launch import serve_in_thread

openai = pytest.importorskip("openai")  # the openai extra
pytest.importorskip("fastapi")  # the serve extra

CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def api():
    """The official client against an in-process server over its own tiny client."""
    client = make_client(LLMConfig(model="tiny", device="cpu"))
    with serve_in_thread(client) as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def chat_stream_texts(chunks) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return texts


@pytest.mark.server
def test_chat_stream_with_the_official_client_equals_direct_generation(api, tiny_llm):
    direct = tiny_llm.chat([CHAT], SamplingParams(temperature=0, max_tokens=40))[0]
    stream = api.chat.completions.create(
        model="tiny",
        messages=CHAT,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 5  # the text came in pieces, not in one block
    assert chat_stream_texts(chunks)[0] == direct.text
    assert chunks[0].choices[0].delta.role == "assistant"
    last = [c for c in chunks if c.choices][-1].choices[0]
    assert last.finish_reason == direct.finish_reason
    assert last.model_extra["token_ids"] == direct.token_ids
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(direct.token_ids)
    assert chunks[-1].usage.prompt_tokens == len(direct.prompt_token_ids)


@pytest.mark.server
def test_seeded_chat_stream_with_n_2(api, tiny_llm):
    params = SamplingParams(temperature=1.0, max_tokens=12, n=2, seed=11)
    direct = tiny_llm.chat([CHAT], params)
    chunks = list(api.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, n=2, seed=11, stream=True))
    assert chat_stream_texts(chunks) == {0: direct[0].text, 1: direct[1].text}


@pytest.mark.server
def test_chat_stream_with_tools_sends_the_parsed_turn_at_the_end(api, tiny_llm):
    plain = api.chat.completions.create(model="tiny", messages=CHAT, tools=TOOLS, max_tokens=20, temperature=0)
    chunks = list(
        api.chat.completions.create(model="tiny", messages=CHAT, tools=TOOLS, max_tokens=20, temperature=0, stream=True)
    )
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 1 and content[0] == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


@pytest.mark.server
def test_completion_stream_with_a_stop_string(api, tiny_llm):
    prompt = "The capital of France is"
    free = tiny_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]  # a string the greedy text reaches midway
    direct = tiny_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, stop=[stop]))[0]
    assert direct.finish_reason == "stop" and direct.text.endswith(stop)
    chunks = list(
        api.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stop=[stop], stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == direct.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_extra["token_ids"] == direct.token_ids
    # a batch of prompts with n=2 streams each choice under its own index (prompt-major, as the direct call)
    prompts, params = ["Hello", "The capital of"], SamplingParams(temperature=0.7, max_tokens=8, n=2, seed=4)
    direct_texts = [c.text for c in tiny_llm.generate(prompts, params)]
    texts: dict[int, str] = {}
    for chunk in api.completions.create(
        model="tiny", prompt=prompts, max_tokens=8, n=2, seed=4, temperature=0.7, stream=True
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[i] for i in range(4)] == direct_texts


def reference_top_logprobs(model, prompt_ids: list[int], token_ids: list[int], k: int):
    """Top-k log-probabilities at each generated position, from one forward pass over prompt + completion."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    values, indices = torch.topk(torch.log_softmax(logits, dim=-1), k, dim=-1)
    return indices.tolist(), values.tolist()


@pytest.mark.server
def test_top_logprobs_match_a_forward_pass(api, tiny_llm):
    response = api.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=10, temperature=0.8, seed=2, logprobs=True, top_logprobs=3
    )
    choice = response.choices[0]
    token_ids, prompt_ids = choice.model_extra["token_ids"], response.model_extra["prompt_token_ids"]
    ids, values = reference_top_logprobs(tiny_llm.model, prompt_ids, token_ids, 3)
    content = choice.logprobs.content
    assert len(content) == len(token_ids)
    for step, entry in enumerate(content):
        assert [t.token for t in entry.top_logprobs] == [tiny_llm.tokenizer.decode([i]) for i in ids[step]]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(values[step], abs=1e-4)
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-6
    # the legacy completions form: logprobs=k gives a {token: logprob} dict of the k most likely per token
    legacy = api.completions.create(model="tiny", prompt=prompt_ids, max_tokens=10, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    ids, values = reference_top_logprobs(tiny_llm.model, prompt_ids, legacy.choices[0].model_extra["token_ids"], 2)
    assert lp.token_logprobs[0] == pytest.approx(values[0][0], abs=1e-4)  # greedy: the sampled token is the top one
    assert list(lp.top_logprobs[0].values()) == pytest.approx(values[0], abs=1e-4)


def test_text_stream_pieces_add_up_and_never_split_a_character(tiny_llm):
    from palaestra.shared.llm.serve.stream import TextStream

    tok = tiny_llm.tokenizer
    text = "héllo wörld 日本語 ok <tool_call> done"
    ids = tok.encode(text, add_special_tokens=False)
    stream = TextStream(tok, end_ids=[], stops=[])
    pieces = [stream.push(t) for t in ids]
    assert "".join(pieces) + stream.rest(tok.decode(ids)) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p) > 5
    # an end-of-turn token ends the stream; a stop string too, and `rest` sends the text through it
    stream = TextStream(tok, end_ids=[7], stops=["wör"])
    sent = "".join(stream.push(t) for t in ids)
    assert "wör" not in sent and stream.done
    final = text[: text.index("wör") + 3]
    assert sent + stream.rest(final) == final
