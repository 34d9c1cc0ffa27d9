"""The LLM path fails loudly: a dead server, and vLLM started without its tool flags, stop the run with one line.

`VllmWithoutToolFlags` answers as vLLM's OpenAI server does when it runs without
``--enable-auto-tool-choice --tool-call-parser``: every request that carries
``tools`` gets HTTP 400 with vLLM's error body (``"auto" tool choice requires
--enable-auto-tool-choice and --tool-call-parser to be set``), every other one
the scripted teacher's answer. Before, such a run kept 0 samples with
``unverified:`` drops and no error, and a dead server showed only as
``tool_maker:no_json`` drops. The real server is exercised in ``test_vllm_server.py``.
"""

from __future__ import annotations

import io
import json
import socket

import pytest

from palaestra.datagen.llm_roles import LLMUnavailable, error_cause
from palaestra.shared.cli import one_line_error

from .test_llm_path import ScriptedTeacher, _generate, _serve  # noqa: F401

VLLM_400 = {
    "object": "error",
    "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


class VllmWithoutToolFlags(ScriptedTeacher):
    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        if not body.get("tools"):
            self.rfile = io.BytesIO(json.dumps(body).encode())  # the scripted teacher reads the body again
            self.headers.replace_header("Content-Length", str(len(json.dumps(body).encode())))
            return super().do_POST()
        data = json.dumps(VLLM_400).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there once the socket is closed


def test_vllm_without_tool_flags_stops_the_run_naming_the_flags(tmp_path):
    server = _serve(VllmWithoutToolFlags)
    try:
        with pytest.raises(LLMUnavailable) as info:
            _generate(tmp_path, f"http://127.0.0.1:{server.server_port}/v1", 4, ["MathAPI"])
    finally:
        server.shutdown()
    line = one_line_error(info.value)
    assert line is not None and "\n" not in line
    assert "--enable-auto-tool-choice" in line and "--tool-call-parser" in line
    assert "5 LLM requests in a row failed" in line
    assert VllmWithoutToolFlags.requests.get("tool_maker", 0) > 0  # requests without tools were answered


def test_a_dead_server_stops_the_run(tmp_path):
    with pytest.raises(LLMUnavailable) as info:
        _generate(tmp_path, _dead_url(), 6, ["MathAPI"])  # one tool-maker request per item
    assert "does not answer" in one_line_error(info.value)


def test_llm_errors_are_counted_in_stats(tmp_path, monkeypatch):
    from palaestra.datagen import pipeline

    monkeypatch.setattr(pipeline.RolesConfig, "max_consecutive_errors", 0)  # never stop: count
    _, result, stats = _generate(tmp_path, _dead_url(), 3, ["MathAPI"])
    assert result["kept"] == 0
    assert stats["llm_errors"] == stats["llm_calls"] == 3  # one tool-maker request per item, each failed
    assert list(stats["llm_error_causes"]) == [error_cause("cannot reach the OpenAI-compatible server")]


def test_error_causes():
    assert "--enable-auto-tool-choice" in error_cause(f"http://x/v1 answered 400: {VLLM_400['message']}")
    assert "does not answer" in error_cause("cannot reach the OpenAI-compatible server at http://x/v1 (refused)")
    assert error_cause("http://x/v1 answered 503: overloaded") == "the server answers 503"


def test_a_worker_that_stopped_stops_the_driver(tmp_path, monkeypatch):
    """With Ray workers the stop arrives as a lost chunk (`TaskFailure`); the driver re-raises it as one line."""
    from palaestra.datagen.generate import DataGenerationConfig, build_graph, run_generation
    from palaestra.shared import cluster
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.tracking import Tracker

    line = "datagen stopped: 5 LLM requests in a row failed; the server does not answer (...)"
    monkeypatch.setattr(
        cluster,
        "parallel_map",
        lambda fn, items, **kw: [cluster.TaskFailure(i, f"LLMUnavailable: {line}") for i in items],
    )
    cfg = DataGenerationConfig(
        num_samples=2, workers=1, envs=["MathAPI"], output_dir=str(tmp_path), tracking=TrackingConfig(enabled=False)
    )
    with pytest.raises(LLMUnavailable) as info:
        run_generation(cfg, build_graph(["MathAPI"]), Tracker(cfg.tracking))
    assert one_line_error(info.value) == line


def test_context_overflow_cause():
    """Both backends' words for a prompt longer than the context are named as such."""
    from palaestra.datagen.llm_roles import is_context_overflow

    tiny = "prompt 0 has 4324 tokens; the model's context is 4096 tokens (tiny)"
    served = "http://x/v1 answered 400: This model's maximum context length is 4096 tokens. However, you requested"
    assert error_cause(tiny) == error_cause(served) == "the prompt outgrows the model's context"
    assert is_context_overflow(served) and not is_context_overflow("http://x/v1 answered 503: overloaded")


class ProseReasoner(ScriptedTeacher):
    """A model that answers the reasoner in prose (vLLM's CPU build with SmolLM2 did): no tool call, ever."""

    def reasoner(self, messages, tools) -> dict:
        return {"content": "To do this you would first compute the value and then report it to the user."}


def test_a_reasoner_answering_in_prose_stops_the_run_naming_the_role(tmp_path):
    server = _serve(ProseReasoner)
    try:
        with pytest.raises(LLMUnavailable) as info:
            _generate(tmp_path, f"http://127.0.0.1:{server.server_port}/v1", 12, ["MathAPI"])
    finally:
        server.shutdown()
    line = one_line_error(info.value)
    assert line is not None and "\n" not in line
    assert "the reasoner answered 5 requests in a row in prose" in line and "--tool-call-parser" in line


def test_prose_answers_are_dropped_under_the_reasoners_name(tmp_path):
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.tracking import Tracker

    server = _serve(ProseReasoner)
    url = f"http://127.0.0.1:{server.server_port}/v1"
    llm = LLMConfig(backend="openai", model="scripted", base_url=url, api_key="x", max_retries=0)
    roles = RolesConfig(reasoner="llm", llm=llm, max_consecutive_errors=0)  # never stop: count
    cfg = DataGenerationConfig(
        num_samples=4,
        workers=0,
        envs=["MathAPI"],
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        roles=roles,
        item=ItemConfig(max_turns=1, p_miss_param=0.0, p_miss_func=0.0, p_parallel=0.0),
        log_samples=False,
    )
    try:
        result = generate(cfg, Tracker(cfg.tracking))
    finally:
        server.shutdown()
    stats = json.loads((cfg.output_path.parent / "stats.json").read_text())
    assert result["kept"] == 0
    assert stats["drops"].get("reasoner:prose", 0) >= 1, stats["drops"]
    assert not any(k.startswith("unverified:") for k in stats["drops"]), stats["drops"]
