"""The segment loop of interruptible vLLM generation (llm/vllm_interrupt.py) over a scripted engine, without
vLLM: what one segment boundary must not change. Each request's tokens come from a fixed script, so the
expected completions are written out by hand: the tokens in order, each tagged with the version reported
before its segment, a stop string that spans two segments found and cut after, the samples of one prompt
seeded apart and per segment, and ``max_tokens`` kept."""

from types import SimpleNamespace

from palaestra.shared.llm.base import SamplingParams
from palaestra.shared.llm.vllm_interrupt import generate_in_segments

SCRIPT = [ord(c) for c in "abcdefghij"]


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class Engine:
    """Continues every request along SCRIPT from where its tokens left off; records each call's seeds."""

    def __init__(self, prompt_len: int):
        self.prompt_len, self.seeds = prompt_len, []

    def generate(self, requests, settings, lora_request=None, use_tqdm=False):
        self.seeds.append([s["seed"] for s in settings])
        out = []
        for request, s in zip(requests, settings):
            done = len(request["prompt_token_ids"]) - self.prompt_len
            ids = SCRIPT[done : done + s["max_tokens"]]
            logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
            sample = SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason="length")
            out.append(SimpleNamespace(outputs=[sample]))
        return out


def client(segment: int, prompt_len: int):
    return SimpleNamespace(
        llm=Engine(prompt_len),
        tokenizer=Tokenizer(),
        config=SimpleNamespace(vllm_segment_tokens=segment),
        context_length=1000,
        vllm_sampling=lambda params, **fields: fields,
    )


def test_tokens_versions_and_max_tokens_across_segments():
    c, versions = client(segment=3, prompt_len=2), iter(range(10))
    (out,) = generate_in_segments(c, [[1, 2]], SamplingParams(max_tokens=8, seed=5), lambda: next(versions))
    assert out.token_ids == SCRIPT[:8] and out.finish_reason == "length"
    assert out.extra["token_versions"] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert out.logprobs == [-0.5] * 8 and out.prompt_token_ids == [1, 2]


def test_a_stop_string_across_a_boundary_ends_the_sequence_after_it():
    c = client(segment=3, prompt_len=2)
    params = SamplingParams(max_tokens=10, stop=["cde"], seed=0)
    (out,) = generate_in_segments(c, [[1, 2]], params, lambda: 0)
    assert out.text == "abcde" and out.finish_reason == "stop" and len(out.logprobs) == 5


def test_samples_and_segments_are_seeded_apart():
    c = client(segment=2, prompt_len=1)
    generate_in_segments(c, [[9]], SamplingParams(max_tokens=4, n=2, seed=3), lambda: 0)
    first, second = c.llm.seeds
    assert len(set(first)) == 2 and len(set(second)) == 2 and not set(first) & set(second)
