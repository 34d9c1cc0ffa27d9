"""The vllm backend: a clear error where vLLM is missing. With vLLM (``vllm`` marker): test_vllm_backend.py."""

import importlib.util

import pytest

from palaestra.shared.llm import LLMConfig, LLMError, make_client

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_choosing_vllm_without_it_is_a_one_line_error():
    with pytest.raises(LLMError, match=r"needs vLLM") as err:
        make_client(LLMConfig(backend="vllm", model="tiny"))
    assert "\n" not in str(err.value)
