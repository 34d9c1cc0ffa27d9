"""One request cannot block the server: queue bound, work cap, cancelled work for gone clients, SIGTERM; the API key."""

import contextlib
import http.client
import json
import signal
import threading
import time
import urllib.parse
import urllib.request

import pytest

from palaestra.shared.llm import LLMConfig, make_client
from palaestra.shared.llm.serve.launch import ServeProcess, exposure_warning, serve_in_thread
from palaestra.shared.llm.serve.model import ServeLimits

pytestmark = pytest.mark.server
pytest.importorskip("fastapi")  # the serve extra

LONG = {"prompt": "Hello", "max_tokens": 3500, "temperature": 0}
"""About 30 s of generation for tiny on one CPU thread (3500 decode steps), unless cancelled."""
SHORT = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}


def post(url: str, body: dict, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response), response.headers
    except urllib.error.HTTPError as err:
        return err.code, json.load(err), err.headers


def open_request(
    url: str, body: dict, headers: dict | None = None
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse | None]:
    """Send `body` and, for a stream, wait for its first event; the caller disconnects by closing the connection."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", parts.path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    if not body.get("stream"):
        return conn, None
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    return conn, response


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.monotonic()
    out = fn(*args)
    return time.monotonic() - t0, out


@pytest.fixture(scope="module")
def client():
    return make_client(LLMConfig(model="tiny", device="cpu"))


@pytest.fixture(scope="module")
def small_server(client):
    """A server that takes one request at a time (queue bound 1)."""
    with serve_in_thread(client, limits=ServeLimits(max_queue=1, max_request_tokens=4096)) as url:
        yield url


def test_full_queue_is_503_and_a_disconnected_stream_stops_generating(small_server):
    short_alone, _ = timed(post, small_server + "/completions", SHORT)
    conn, response = open_request(small_server + "/completions", {**LONG, "stream": True})
    status, body, headers = post(small_server + "/completions", SHORT)
    assert status == 503 and body["error"]["type"] == "server_overloaded" and headers["Retry-After"] == "1"
    assert "--max-queue" in body["error"]["message"]
    response.close()
    conn.close()
    # the long generation ends at its next decode step: a short request is answered about as fast as alone
    elapsed, (status, body, _) = timed(post, small_server + "/completions", SHORT)
    if status == 503:  # the cancelled job may still be winding down for a moment
        time.sleep(0.5)
        elapsed, (status, body, _) = timed(post, small_server + "/completions", SHORT)
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 2
    assert elapsed < short_alone + 5.0, (elapsed, short_alone)


def test_a_disconnected_plain_request_stops_generating(small_server):
    conn, _ = open_request(small_server + "/completions", LONG)
    time.sleep(1.0)  # it is generating now
    conn.close()
    t0 = time.monotonic()
    while True:  # 503 while the cancelled job ends (the queue holds one), then 200
        status, body, _ = post(small_server + "/completions", SHORT)
        if status != 503 or time.monotonic() - t0 > 20:
            break
        time.sleep(0.2)
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 2
    assert time.monotonic() - t0 < 5.0  # not the ~30 s the long request would have taken


def test_work_per_request_is_capped(small_server):
    status, body, _ = post(small_server + "/completions", {"prompt": "x", "n": 32, "max_tokens": 1_000_000_000})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "n=32 x max_tokens=1000000000" in body["error"]["message"] and "allows 4096" in body["error"]["message"]
    status, body, _ = post(
        small_server + "/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2, "max_tokens": 2049}
    )
    assert status == 400 and "allows 4096" in body["error"]["message"]


def test_api_key(client):
    openai = pytest.importorskip("openai")

    with serve_in_thread(client, api_key="s3cret") as url:
        status, body, _ = post(url + "/completions", SHORT)
        assert status == 401 and body["error"]["type"] == "invalid_api_key"
        status, _, _ = post(url + "/completions", SHORT, {"Authorization": "Bearer wrong"})
        assert status == 401
        status, body, _ = post(url + "/completions", SHORT, {"Authorization": "Bearer s3cret"})
        assert status == 200 and len(body["choices"][0]["token_ids"]) == 2
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as response:  # health needs no key
            assert response.status == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert openai.OpenAI(base_url=url, api_key="s3cret").models.list().data[0].id == "tiny"


def test_exposure_warning_names_the_fix():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert exposure_warning(host, None) is None
    for host in ("0.0.0.0", "192.168.1.5", "::", "myhost.example"):
        warning = exposure_warning(host, None)
        assert warning and host in warning and "--api-key" in warning and "PALAESTRA_API_KEY" in warning
        assert exposure_warning(host, "key") is None


@pytest.mark.slow
def test_sigterm_stops_a_busy_server_within_seconds(monkeypatch):
    # also the command line's limits and key: --max-queue, and the key from PALAESTRA_API_KEY
    monkeypatch.setenv("PALAESTRA_API_KEY", "k")
    with ServeProcess("tiny", ("--device", "cpu", "--max-queue", "1")) as server:
        assert post(server.url + "/completions", SHORT)[0] == 401
        conn, response = open_request(
            server.url + "/completions", {**LONG, "stream": True}, {"Authorization": "Bearer k"}
        )
        assert post(server.url + "/completions", SHORT, {"Authorization": "Bearer k"})[0] == 503
        server.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = server.proc.wait(timeout=30)
        elapsed = time.monotonic() - t0
        events = response.read().decode()  # what the stream got before the end
        conn.close()
        log = server.output()
    print(f"SIGTERM with a stream running: exited after {elapsed:.2f} s")
    assert elapsed < 5.0, elapsed
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled once it has shut down
    assert "Traceback" not in log, log
    assert "shutting down" in events or "[DONE]" in events or events == ""


def test_leaving_serve_in_thread_cancels_a_running_generation(client):
    def ask(url: str) -> None:
        with contextlib.suppress(OSError):  # the server may close the connection instead of answering 503
            post(url + "/completions", LONG)

    with serve_in_thread(client) as url:
        thread = threading.Thread(target=ask, args=(url,))
        thread.start()
        time.sleep(1.0)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10.0
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_serve_warns_before_binding_beyond_loopback_without_a_key(monkeypatch, capsys):
    from palaestra.shared.llm import LLMError
    from palaestra.shared.llm.serve import launch as serve_module

    def stop(config):
        raise LLMError("stopped before loading")  # nothing is bound: the warning comes first

    monkeypatch.setattr(serve_module, "make_client", stop)
    monkeypatch.delenv("PALAESTRA_API_KEY", raising=False)
    with pytest.raises(LLMError, match="stopped before loading"):
        serve_module.serve(LLMConfig(model="tiny"), host="0.0.0.0")
    assert "listening on 0.0.0.0 without an API key" in capsys.readouterr().err
    monkeypatch.setenv("PALAESTRA_API_KEY", "k")
    with pytest.raises(LLMError):
        serve_module.serve(LLMConfig(model="tiny"), host="0.0.0.0")
    assert capsys.readouterr().err == ""
