"""The openai backend against a minimal stand-in for a hosted API (no token ids, parsed tool calls, strict params)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
from palaestra.shared.toolcall import ToolCall, format_calls, parse_response


class HostedLikeAPI(BaseHTTPRequestHandler):
    """Refuses unknown parameters (as OpenAI's API does), answers with parsed tool calls and no token ids."""

    seen: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        if "return_token_ids" in body:
            return self._send(400, {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}})
        if self.path.endswith("/chat/completions"):
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "look it up"}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
            return self._send(
                200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
            )
        choice = {
            "index": 0,
            "text": " Paris.",
            "finish_reason": "stop",
            "logprobs": {"tokens": [" Paris", "."], "token_logprobs": [-0.1, -0.2], "text_offset": [0, 6]},
        }
        return self._send(
            200, {"id": "y", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
        )

    def _send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def hosted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostedLikeAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    HostedLikeAPI.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_hosted_api_without_token_ids(hosted):
    client = make_client(LLMConfig(backend="openai", model="m", base_url=hosted, max_retries=0))
    out = client.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))[0]
    assert out.text == " Paris." and out.logprobs == [-0.1, -0.2] and out.finish_reason == "stop"
    assert out.token_ids == [] and out.extra["token_ids_missing"]
    # the refused flag was dropped once, then never sent again
    assert ["return_token_ids" in b for b in HostedLikeAPI.seen] == [True, False]
    chat = client.chat([[{"role": "user", "content": "weather in Paris?"}]], SamplingParams(max_tokens=30))[0]
    assert "return_token_ids" not in HostedLikeAPI.seen[-1]
    # a parsed turn comes back in the project's format, so toolcall.parse_response recovers it
    assert chat.text == format_calls([ToolCall("get_weather", {"city": "Paris"})], thinking="look it up")
    assert parse_response(chat.text).calls == [ToolCall("get_weather", {"city": "Paris"})]
    assert chat.finish_reason == "stop"
