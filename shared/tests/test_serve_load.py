"""A bounded load test of ``palaestra serve`` on loopback: 200 requests, 16 at once, good ones mixed with bad ones.

Every good request must be answered with exactly the direct generation's tokens, every bad one with a 400, the
server must be up afterwards, and its resident memory must not grow by more than `RSS_GROWTH_BOUND_MB`.
"""

import http.client
import json
import random
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from palaestra.shared.llm import SamplingParams
from palaestra.shared.llm.serve.launch import ServeProcess

psutil = pytest.importorskip("psutil")
pytest.importorskip("fastapi")  # the serve extra

REQUESTS, CONCURRENCY = 200, 16
RSS_GROWTH_BOUND_MB = 64
"""Measured growth after a warm-up round is a few MB; a leak per request (prompt ids, streams, futures) is not."""

PROMPTS = ["Hello world", "The capital of France is", "1 + 1 =", "weather in Paris", "<tool_call>"]
CONVERSATIONS = [[{"role": "user", "content": c}] for c in ("hi", "what is 2 + 2?", "book a flight to Tokyo")]
BAD = [
    ("/completions", {"prompt": [5, 123456], "max_tokens": 4}),  # token id outside the vocabulary
    ("/completions", {"prompt": [5] * 4200, "max_tokens": 4}),  # longer than the context
    ("/completions", {"prompt": "x", "n": 64, "max_tokens": 4096}),  # too much work
    ("/chat/completions", {"messages": [{"content": "no role"}], "max_tokens": 4}),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.7}),
    ("/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'),
    ("/completions", b'{"prompt": "unterminated'),
]


def send(base: str, path: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def stream_chat(base: str, body: dict, abandon: bool) -> str | None:
    """The streamed text, or None after leaving the stream at its second event (a client that goes away)."""
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(
            "POST",
            parts.path + "/chat/completions",
            json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        assert response.status == 200
        text, events = "", 0
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            events += 1
            if abandon and events == 2:
                return None
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
        return text
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.server
def test_load_mixed_good_and_bad_requests(tiny_llm):
    greedy = SamplingParams(temperature=0, max_tokens=6)
    want_completion = {p: tiny_llm.generate([p], greedy)[0].token_ids for p in PROMPTS}
    want_chat = {i: tiny_llm.chat([c], greedy)[0] for i, c in enumerate(CONVERSATIONS)}
    rng = random.Random(0)
    plan = []
    for _ in range(REQUESTS):
        kind = rng.choices(["completion", "chat", "stream", "abandon", "bad"], [35, 20, 10, 5, 30])[0]
        plan.append((kind, rng.randrange(len(PROMPTS)), rng.randrange(len(CONVERSATIONS)), rng.randrange(len(BAD))))

    with ServeProcess("tiny", ("--device", "cpu")) as server:
        process = psutil.Process(server.proc.pid)

        def run(item) -> tuple[str, bool, str]:
            kind, p, c, b = item
            common = {"max_tokens": 6, "temperature": 0}
            if kind == "completion":
                status, body = send(server.url, "/completions", {"prompt": PROMPTS[p], **common})
                ok = status == 200 and body["choices"][0]["token_ids"] == want_completion[PROMPTS[p]]
            elif kind == "chat":
                status, body = send(server.url, "/chat/completions", {"messages": CONVERSATIONS[c], **common})
                ok = status == 200 and body["choices"][0]["token_ids"] == want_chat[c].token_ids
            elif kind in ("stream", "abandon"):
                text = stream_chat(server.url, {"messages": CONVERSATIONS[c], **common}, kind == "abandon")
                ok = text is None if kind == "abandon" else text == want_chat[c].text
                status, body = 200, {"text": text}
            else:
                path, bad = BAD[b]
                status, body = send(server.url, path, bad)
                ok = status == 400 and "\n" not in body["error"]["message"]
            return kind, ok, f"{status} {json.dumps(body)[:200]}"

        with ThreadPoolExecutor(CONCURRENCY) as pool:
            warm = list(pool.map(run, plan[:32]))
            rss_before = process.memory_info().rss
            rest = list(pool.map(run, plan[32:]))
        rss_after = process.memory_info().rss
        failures = [(kind, detail) for kind, ok, detail in warm + rest if not ok]
        assert not failures, failures[:5]
        # still up and still right
        status, body = send(server.url, "/completions", {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0})
        assert status == 200 and body["choices"][0]["token_ids"] == want_completion[PROMPTS[0]]
    growth_mb = (rss_after - rss_before) / 2**20
    print(f"RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MB")
    assert growth_mb < RSS_GROWTH_BOUND_MB, f"server RSS grew {growth_mb:.1f} MB over {REQUESTS - 32} requests"
    kinds = {kind for kind, *_ in plan}
    assert kinds == {"completion", "chat", "stream", "abandon", "bad"}
