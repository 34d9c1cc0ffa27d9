"""The vllm backend: a clear error where vLLM is missing; weight updates on a GPU node (``gpu`` marker).

Generation itself is covered by the conformance suite (test_llm_conformance.py), which includes vllm on GPU.
"""

import importlib.util

import pytest

from palaestra.shared.llm import LLMConfig, LLMError, SamplingParams, make_client

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_choosing_vllm_without_it_is_a_one_line_error():
    with pytest.raises(LLMError, match=r"needs vLLM") as err:
        make_client(LLMConfig(backend="vllm", model="tiny"))
    assert "\n" not in str(err.value)


@pytest.mark.gpu
def test_vllm_load_weights_takes_another_models_weights(tiny_llm):
    pytest.importorskip("vllm")
    engine = make_client(LLMConfig(backend="vllm", model="tiny", gpu_memory_utilization=0.2))
    other = make_client(LLMConfig(model="tiny", device="cpu", seed=1))
    params = SamplingParams(temperature=0, max_tokens=8)
    prompts = ["Hello world", "The capital of France is"]
    before = [c.token_ids for c in engine.generate(prompts, params)]
    engine.load_weights(other.model.state_dict())
    after = [c.token_ids for c in engine.generate(prompts, params)]
    assert after != before
    # and back: the seed-0 weights give the seed-0 generations again (stale prefix cache dropped)
    engine.load_weights(tiny_llm.model.state_dict())
    assert [c.token_ids for c in engine.generate(prompts, params)] == before
