"""Several policies with a model each, served by vLLM on a rollout worker (rollout/serving.py `ModelServing`: a
vLLM engine per policy), against the learner's side: the transformers backend with each policy's weights.

One policy keeps `tiny`'s weights, the other takes a learner step's; a sync loads each policy's state dict into
its own engine. Every agent's turns equal, token for token, the rollout of two transformers clients holding
those weights; the control: the rollout with both on the old weights differs in the second policy's seat. The
session's `vllm_tiny` is the first engine (one more is started here)."""

import pytest

from palaestra.shared.config import ConfigError, TrackingConfig, check_fields
from palaestra.shared.llm import LLMConfig, make_client
from palaestra.shared.rl.config import EnvSpec, PolicySpec, TrainConfig, WorkersConfig
from palaestra.shared.rollout import serving as serving_module
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.rollout.serving import ModelServing, PolicyRoutes
from palaestra.shared.testing import TakeTurns, tiny_learner, two_weight_versions

VLLM = LLMConfig(backend="vllm", model="tiny", dtype="float32", gpu_memory_utilization=0.2)
GREEDY = RolloutConfig(group_size=1, max_tokens_per_turn=6, temperature=0.0)


class Duel(TakeTurns):
    def observe(self, agent):
        return [{"role": "user", "content": f"game {self.seed} move {self.t}"}]


def play(engine_or_worker):
    specs = [EpisodeSpec(Duel, seed=i, group_id=str(i)) for i in range(2)]
    result = engine_or_worker.run(specs, 7)
    return sorted((t.group_id, t.agent, [x.response_ids for x in t.turns]) for t in result.trajectories)


def reference(first: dict, second: dict):
    a, b = tiny_learner(), tiny_learner()
    a.model.load_state_dict(first)
    b.model.load_state_dict(second)
    return play(RolloutEngine(a, GREEDY, {"p0": a, "p1": b}.get))


@pytest.mark.vllm
def test_each_policy_plays_on_its_own_vllm_engine_with_its_own_weights(vllm_tiny, monkeypatch):
    from palaestra.shared.rollout.workers import RolloutWorker

    _, old, new = two_weight_versions()
    made = iter([vllm_tiny])
    monkeypatch.setattr(serving_module, "make_client", lambda llm: next(made, None) or make_client(llm))
    worker = RolloutWorker(VLLM, GREEDY, 1, ModelServing({"a": VLLM, "b": VLLM}, PolicyRoutes({"p0": "a", "p1": "b"})))
    second = worker.replica.parts["b"].client
    try:
        assert second is not vllm_tiny and type(second) is type(vllm_tiny)
        worker.load_weights({"a": old, "b": new}, 1)  # what RayRollouts.sync sends: each policy's state dict
        ours = play(worker)
    finally:
        vllm_tiny.load_weights(old)  # the session's engine is shared
        second.close()
    assert ours == reference(old, new)
    control = reference(old, old)
    assert [t for t in ours if t[1] == "p1"] != [t for t in control if t[1] == "p1"]  # the step moved p1's tokens
    assert [t for t in ours if t[1] == "p0"] == [t for t in control if t[1] == "p0"]


def test_vllm_policy_engines_must_fit_one_gpu_together(tmp_path):
    two = {"a": PolicySpec(agents=["p0"]), "b": PolicySpec(agents=["p1"])}
    cfg = lambda share: TrainConfig(  # noqa: E731
        envs=[EnvSpec("task")],
        job="rl.train",
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        policies=two,
        workers=WorkersConfig(num_workers=1, llm=LLMConfig(backend="vllm", model="tiny", gpu_memory_utilization=share)),
    )
    check_fields(cfg(0.45))
    with pytest.raises(ConfigError, match="set it to at most 0.47"):
        check_fields(cfg(0.6))
