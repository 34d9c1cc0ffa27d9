"""vLLM's sleep mode against the pinned vLLM (``.venv-vllm``, the CPU build): the API llm/sleep_mode.py is written
against, and the one-line error where the build refuses it. The CPU build cannot sleep (its platform says so and
its worker's ``sleep`` is a no-op), so the order itself is tested with a recording engine (test_layout.py)."""

import inspect

import pytest

from palaestra.shared.llm.base import LLMConfig, LLMError

pytestmark = pytest.mark.vllm


def test_the_pinned_vllm_has_the_sleep_api_the_colocation_calls():
    vllm = pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    assert "level" in inspect.signature(vllm.LLM.sleep).parameters
    assert "tags" in inspect.signature(vllm.LLM.wake_up).parameters
    assert "enable_sleep_mode" in inspect.signature(EngineArgs).parameters
    # the tags llm/sleep_mode.py wakes in turn are the ones vLLM's wake_up documents
    from palaestra.shared.llm.sleep_mode import WAKE_ORDER

    doc = inspect.getdoc(vllm.LLM.wake_up) or ""
    assert all(f'"{tag}"' in doc for tags in WAKE_ORDER for tag in tags)


def test_sleep_mode_on_the_cpu_build_is_one_line_naming_the_key():
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from palaestra.shared.llm.vllm_backend import VLLMClient

    if current_platform.is_sleep_mode_available():
        pytest.skip("this vLLM can sleep (a GPU build): nothing to refuse")
    with pytest.raises(LLMError, match="llm.sleep_mode: vLLM's sleep mode needs a GPU"):
        VLLMClient(LLMConfig(backend="vllm", model="tiny", sleep_mode=True))
