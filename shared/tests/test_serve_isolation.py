"""One client's bad request never fails another's: validation before batching, per-job isolation in the batcher."""

import json
import random
import threading
import time
import urllib.request

import pytest

from palaestra.shared.llm import LLMConfig, LLMError, SamplingParams, make_client
from palaestra.shared.llm.base import Completion
from palaestra.shared.llm.serve.batcher import MicroBatcher, ServeRequest
from palaestra.shared.llm.serve.launch import serve_in_thread
from palaestra.shared.llm.serve.model import ServeLimits


def post(url: str, body: dict | bytes, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@pytest.fixture(scope="module")
def server():
    """An in-process server over its own tiny client (same weights as `tiny_llm`, which the tests compare with)."""
    pytest.importorskip("fastapi")  # the serve extra
    client = make_client(LLMConfig(model="tiny", device="cpu"))
    with serve_in_thread(client, limits=ServeLimits(max_request_tokens=4096)) as url:
        yield url


@pytest.mark.server
def test_concurrent_good_and_bad_requests_each_get_their_own_answer(server, tiny_llm):
    greedy = SamplingParams(temperature=0, max_tokens=8)
    seeded = SamplingParams(temperature=0.9, max_tokens=8, seed=3)
    good = {
        f"greedy{i}": ({"prompt": p, "max_tokens": 8, "temperature": 0}, greedy, p)
        for i, p in enumerate(["Hello world", "The capital of France is", "1 + 1 =", "weather in Paris"])
    }
    good["ids"] = ({"prompt": [42, 399, 81], "max_tokens": 8, "temperature": 0}, greedy, [42, 399, 81])
    good["seeded"] = ({"prompt": "Hello", "max_tokens": 8, "temperature": 0.9, "seed": 3}, seeded, "Hello")
    # the references come first, from a direct generation on the test's own client (never concurrently)
    expected = {name: tiny_llm.generate([prompt], params)[0].token_ids for name, (_, params, prompt) in good.items()}
    bad = {
        "out_of_vocab": ({"prompt": [5, 99999, 7], "max_tokens": 8, "temperature": 0}, "99999 is not in the vocab"),
        "negative_id": ({"prompt": [5, -1], "max_tokens": 8, "temperature": 0}, "token id -1"),
        "too_long": ({"prompt": [5] * 5000, "max_tokens": 8, "temperature": 0}, "context is 4096"),
        "too_much_work": ({"prompt": "x", "max_tokens": 1000, "n": 8, "temperature": 0}, "allows 4096 per request"),
        "empty_in_batch": ({"prompt": ["Hello", ""], "max_tokens": 8, "temperature": 0}, "prompt 1 is empty"),
    }
    results: dict = {}

    def ask(name: str, body: dict) -> None:
        results[name] = post(server + "/completions", body)

    # every bad request is sent twice, so bad ones sit beside good ones in the queue whatever the timing
    jobs = [(name, body) for name, (body, _, _) in good.items()]
    jobs += [(f"{name}/{k}", body) for name, (body, _) in bad.items() for k in range(2)]
    random.Random(0).shuffle(jobs)
    threads = [threading.Thread(target=ask, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in good:
        status, body = results[name]
        assert status == 200, (name, body)
        assert body["choices"][0]["token_ids"] == expected[name], name
    for name, (_, message) in bad.items():
        for k in range(2):
            status, body = results[f"{name}/{k}"]
            assert status == 400 and message in body["error"]["message"], (name, body)


@pytest.mark.server
@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"messages": [{"content": "hi"}]}, "messages.0.role", "Field required"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", "Input should be"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2.7}, "max_tokens", "got 2.7"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, "max_tokens", "valid integer"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n", "greater than or equal to 1"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -0.5}, "temperature", "greater than"),
        ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p", "greater than 0"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": [""]}, None, "stop strings must not be empty"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["x" * 600]}, None, "at most 16 stop strings"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 17}, None, "of at most 512 characters"),
        ({"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 1}, None, "not supported"),
        ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs", ""),
        ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, None, "needs logprobs=true"),
        ({"messages": []}, "messages", "at least 1"),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
            "valid boolean",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, None, ""),
        ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens", "got 2.5"),
        ({"prompt": [1, 2.5]}, "prompt", ""),
        ({"prompt": []}, None, "must not be empty"),
        ({"prompt": "hi", "echo": True}, None, "echo is not supported"),
    ],
)
def test_invalid_requests_are_400_with_an_openai_error_body(server, body, param, message):
    endpoint = "/chat/completions" if "messages" in body else "/completions"
    status, answer = post(server + endpoint, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert message in error["message"] and "\n" not in error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.server
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_temperature_is_400(server, value):
    # Python's JSON (and the server's) reads these literals; OpenAI's schema has no place for them
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": %s}' % value.encode()
    status, answer = post(server + "/chat/completions", raw)
    assert status == 400 and answer["error"]["param"] == "temperature"
    assert "finite" in answer["error"]["message"]


@pytest.mark.server
def test_chat_forms_the_server_reads(server, tiny_llm):
    params = SamplingParams(temperature=0, max_tokens=6)
    want = tiny_llm.chat([[{"role": "user", "content": "hi there"}]], params)[0].token_ids
    parts = [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 6, "temperature": 0}
    status, answer = post(server + "/chat/completions", body)
    assert status == 200 and answer["choices"][0]["token_ids"] == want  # text parts are joined
    long = {"messages": [{"role": "user", "content": "hi " * 5000}], "max_tokens": 2}
    status, answer = post(server + "/chat/completions", long)
    assert status == 400 and answer["error"]["param"] == "messages"
    assert "the messages render to" in answer["error"]["message"] and "context is 4096" in answer["error"]["message"]


@pytest.mark.server
def test_unknown_model_is_404_and_malformed_json_is_400(server):
    status, answer = post(server + "/completions", {"model": "gpt-9", "prompt": "x"})
    assert (
        status == 404 and answer["error"]["type"] == "model_not_found" and "serves 'tiny'" in answer["error"]["message"]
    )
    status, answer = post(server + "/completions", b"{not json")
    assert status == 400 and "error" in answer


class PoisonClient:
    """Fails any batch that contains the prompt 'poison' (as a backend fails on one bad row); slow enough to merge."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        time.sleep(0.05)
        if "poison" in prompts:
            raise LLMError("prompt 'poison' is poisonous")
        return [Completion(p.upper(), [], [], [], "stop") for p in prompts for _ in range(params.n)]


def test_batcher_isolates_a_failing_job_from_its_batch():
    client = PoisonClient()
    batcher = MicroBatcher(client)
    blocker = batcher.submit(
        ServeRequest(["first"], SamplingParams())
    )  # holds the worker so the rest queue up together
    futures = {p: batcher.submit(ServeRequest([p], SamplingParams())) for p in ["a", "poison", "b", "c"]}
    assert [c.text for c in blocker.result(timeout=10)] == ["FIRST"]
    for prompt, future in futures.items():
        if prompt == "poison":
            with pytest.raises(LLMError, match="poisonous"):
                future.result(timeout=10)
        else:
            assert [c.text for c in future.result(timeout=10)] == [prompt.upper()]
    merged = [call for call in client.calls if len(call) > 1]
    assert merged and "poison" in merged[0]  # they were merged once, then each ran alone
    assert ["poison"] in client.calls and ["a"] in client.calls
    assert batcher.active == 0


def test_missing_serving_stack_names_the_extra(monkeypatch):
    import sys

    from palaestra.shared.extras import MissingExtraError
    from palaestra.shared.llm.serve.app import create_app

    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the serve extra were not installed
    with pytest.raises(
        MissingExtraError, match=r"palaestra serve needs fastapi: pip install 'palaestra-shared\[serve\]'"
    ):
        create_app(PoisonClient(), "tiny")  # type: ignore[arg-type]


@pytest.mark.server
def test_generation_failures_get_openai_error_bodies():
    pytest.importorskip("fastapi")

    class Broken:
        """A backend without a local tokenizer whose generation fails: a bug (500) or the prompt's fault (400)."""

        tokenizer = None

        def generate(self, prompts, params):
            if prompts == ["bug"]:
                raise RuntimeError("boom")
            raise LLMError("this prompt cannot be generated")

    with serve_in_thread(Broken(), "broken") as url:  # type: ignore[arg-type]
        status, body = post(url + "/completions", {"prompt": "bug"})
        assert status == 500 and body["error"] == {
            "message": "generation failed: RuntimeError: boom",
            "type": "server_error",
            "param": None,
            "code": 500,
        }
        status, body = post(url + "/completions", {"prompt": "fault"})
        assert status == 400 and body["error"]["message"] == "this prompt cannot be generated"
        request = urllib.request.Request(
            url + "/completions",
            json.dumps({"prompt": "bug", "stream": True}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            events = [line[6:].strip() for line in response.read().decode().splitlines() if line.startswith("data: ")]
        assert json.loads(events[0])["error"]["code"] == 500 and events[-1] == "[DONE]"


@pytest.mark.server
def test_a_too_large_body_is_413_before_it_is_read():
    pytest.importorskip("fastapi")
    client = PoisonClient()
    client.tokenizer = None  # type: ignore[attr-defined]
    with serve_in_thread(client, "echo", ServeLimits(max_body_bytes=1000)) as url:  # type: ignore[arg-type]
        status, body = post(url + "/completions", {"prompt": "x" * 2000})
        assert status == 413 and "takes at most 1000" in body["error"]["message"]
        status, body = post(url + "/completions", {"prompt": "small"})
        assert status == 200 and body["choices"][0]["text"] == "SMALL"
        assert client.calls == [["small"]]  # the large one never reached the model
