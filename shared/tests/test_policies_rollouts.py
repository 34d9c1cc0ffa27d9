"""Several policies, each with a model of its own, on Ray rollout workers and ahead of the learner (rl/policies.py,
rollout/workers.py `Replica`, rl/async_rollouts.py): a run on Ray equals the run with in-process rollouts; each
sync loads every policy's weights into its own model; two policies one step ahead (``version_schedule: fixed``)
tag every token with its policy's version max(0, s - 1), agree in-process and on Ray, and resume bit for bit."""

import copy
import dataclasses
import sys

import pytest
import torch

from palaestra.shared.config import TrackingConfig
from palaestra.shared.llm import LLMConfig, make_client
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.config import EnvSpec, OptimConfig, PolicySpec, TrainConfig, WorkersConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.testing import TEST_CLUSTER, TakeTurns

torch.set_num_threads(1)

# two roles, two models: the critic's is another `tiny` (its own random weights) with its own learning rate
ROLES = {
    "solver": PolicySpec(agents=["solver"]),
    "critic": PolicySpec(agents=["critic"], llm=LLMConfig(model="tiny", seed=1), optim=OptimConfig(lr=3e-4)),
}
RAY = WorkersConfig(num_workers=1, num_cpus=0.5)


class Talk(TakeTurns):
    """Solver, critic, solver, critic: each move earns its mover the number of distinct characters it wrote / 10
    (rewards that vary within a group, so both policies learn from the first step)."""

    agents = ["solver", "critic"]
    env_type = "text"

    def move_reward(self, action):
        return len(set(action)) / 10


def talk(trainer: Trainer) -> Trainer:
    """`trainer` drawing two `Talk` tasks a step (the class travels to Ray workers by value)."""
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    trainer.batch_rule.draw = lambda step: [EpisodeSpec(Talk, seed=i, group_id=f"{step}-{i}") for i in range(2)]
    return trainer


def config(tmp_path, name: str, k: int = 0, **kw) -> TrainConfig:
    rollout = RolloutConfig(group_size=2, max_tokens_per_turn=4, max_staleness=k, version_schedule="fixed")
    base = dict(
        envs=[EnvSpec("solver_critic", {"source": "next_number"})],  # its agents; the tasks are `talk`'s
        job="rl.train",
        output_dir=str(tmp_path / name),
        tracking=TrackingConfig(enabled=False),
        rollout=rollout,
        advantages=[AdvantageStep("grpo")],
        loss=LossConfig(kl_coef=0.1, behaviour_correction="tis", logprob_temperature=1.0),
        optim=OptimConfig(lr=1e-3),
        policies=ROLES,
        cluster=TEST_CLUSTER,
        steps=3,
        tasks_per_step=2,
        checkpoint_every=0,
    )
    return TrainConfig(**{**base, **kw})


def comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # wall times differ


def models(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    return {p.name: copy.deepcopy(p.model.state_dict()) for p in trainer.policies}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def as_one_ray_shard(trainer: Trainer) -> None:
    """In-process rollouts seeded as a one-worker Ray pool seeds its one shard (``seed * 1009 + 0``)."""
    trainer.prepare()
    seed = trainer.stream.seed
    trainer.stream.seed = lambda step: seed(step) * 1009


def in_process(tmp_path, name: str, k: int, steps: int, **kw) -> tuple[list[dict], dict]:
    torch.manual_seed(0)  # LoRA's initial adapters are drawn from torch's global RNG (the Ray run seeds it too)
    with talk(Trainer(config(tmp_path, name, k, **kw))) as tr:
        as_one_ray_shard(tr)
        return [comparable(tr.train_step()) for _ in range(steps)], models(tr)


def test_two_policies_one_step_ahead_resume_bit_exact_in_process(tmp_path):
    """k = 1, fixed, in-process (the background engine holds a copy of each policy's model): every token of
    step s, of either policy, is of version max(0, s - 1); 3 steps straight equal 1 step, a checkpoint holding
    the rollout in flight, and 2 steps resumed, bit for bit."""
    with talk(Trainer(config(tmp_path, "straight", 1))) as tr:
        tr.prepare()
        taken, take = [], tr.stream.take
        tr.stream.take = lambda step: taken.append(take(step)) or taken[-1]
        straight = [comparable(tr.train_step())]
        version_1 = models(tr)
        straight += [comparable(tr.train_step()) for _ in range(2)]
        final = models(tr)
        specs, seed = tr.draw_tasks(2), tr.stream.seed(2)
    # step 2 replayed on fresh copies of each policy's version-1 weights, each agent on its own policy's
    clients = {role: make_client(LLMConfig(model="tiny")) for role in ROLES}
    for role, client in clients.items():
        client.load_weights(version_1[role])
    replay = RolloutEngine(clients["solver"], tr.cfg.rollout, route=clients.__getitem__).run(specs, seed)
    ids = lambda r: [(t.agent, [turn.response_ids for turn in t.turns]) for t in r.trajectories]  # noqa: E731
    assert ids(taken[2]) == ids(replay)
    for s, m in enumerate(straight):
        for role in ROLES:
            assert m[f"policy/{role}/async/tokens_lag_{min(s, 1)}"] > 0, (s, role)
            assert m[f"policy/{role}/async/tokens_lag_{1 - min(s, 1)}"] == 0, (s, role)
    with talk(Trainer(config(tmp_path, "cut", 1))) as tr:
        first = [comparable(tr.train_step())]
        saved = tr.save()
    assert (saved / "rollouts_ahead.pkl").is_file()  # step 1 was in flight
    with talk(Trainer(config(tmp_path, "cut", 1, resume=True))) as tr:
        tr.prepare()
        assert tr.step == 1 and sorted(tr.stream.inflight) == [1]
        rest = [comparable(tr.train_step()) for _ in range(2)]
        after = models(tr)
    assert first + rest == straight
    assert all(same(after[role], final[role]) for role in ROLES)
    assert not same(final["solver"], final["critic"])


@pytest.mark.slow  # a Ray actor with two model replicas
def test_ray_workers_train_two_models_as_in_process_rollouts(tmp_path, ray_local):
    """Synchronous (k = 0): one Ray worker holding both policies' models gives the run of in-process rollouts
    (seeded as its shard) bit for bit; after each update the worker's model of each policy is that policy's
    learner model, and every sync sends each policy's weights under its own name."""
    local, local_final = in_process(tmp_path, "local", 0, 2)
    payloads = []
    with talk(Trainer(config(tmp_path, "ray", 0, workers=RAY, steps=2))) as tr:
        tr.prepare()
        start = models(tr)
        sync = tr.rollouts.sync
        tr.rollouts.sync = lambda state, version=None: payloads.append(state) or sync(state, version)
        ray_run = []
        for _ in range(2):
            ray_run.append(comparable(tr.train_step()))
            held = tr.rollouts.ray.get(
                tr.rollouts.workers[0].__ray_call__.remote(
                    lambda w: {key: v.client.model.state_dict() for key, v in w.replica.parts.items()}
                )
            )
            learner = models(tr)
            assert all(same(held[role], learner[role]) for role in ROLES)  # each model its own policy's
            assert not same(held["critic"], learner["solver"])
        ray_final = models(tr)
    assert ray_run == local
    assert all(same(ray_final[role], local_final[role]) for role in ROLES)
    assert all(set(p) == set(ROLES) for p in payloads) and len(payloads) == 2
    assert not any(same(ray_final[role], start[role]) for role in ROLES)  # both trained


@pytest.mark.slow  # Ray actors with two model replicas
def test_two_policies_one_step_ahead_on_ray_as_in_process_and_resumed(tmp_path, ray_local):
    """k = 1, fixed, two models on one Ray worker: 1 step, a checkpoint (step 1's rollout collected from the
    worker), 2 steps resumed on a new worker: the in-process run of 3 steps (seeded as the shard), bit for bit."""
    local, local_final = in_process(tmp_path, "local", 1, 3)
    with talk(Trainer(config(tmp_path, "ray", 1, workers=RAY))) as tr:
        first = [comparable(tr.train_step())]
        tr.save()
    with talk(Trainer(config(tmp_path, "ray", 1, workers=RAY, resume=True))) as tr:
        rest = [comparable(tr.train_step()) for _ in range(2)]
        after = models(tr)
    assert first + rest == local
    assert all(same(after[role], local_final[role]) for role in ROLES)


@pytest.mark.slow  # a Ray actor with a model replica
def test_lora_policies_one_step_ahead_on_ray_as_in_process(tmp_path, ray_local):
    """k = 1, fixed, two LoRA policies as adapters on one base: the background engine's copy of the base with
    both adapters and the Ray worker's give the same run; every token of either policy is of version
    max(0, s - 1) (each adapter's client tags its own)."""
    from palaestra.shared.llm.lora import LoraConfig

    roles = {"solver": ROLES["solver"], "critic": dataclasses.replace(ROLES["critic"], llm=None)}
    lora = dict(policies=roles, lora=LoraConfig(enabled=True, r=4, alpha=8), loss=LossConfig(kl_coef=0.0))
    local, _ = in_process(tmp_path, "local", 1, 3, **lora)
    for s, m in enumerate(local):
        for role in roles:
            assert m[f"policy/{role}/async/tokens_lag_{min(s, 1)}"] > 0, (s, role)
            assert m[f"policy/{role}/async/tokens_lag_{1 - min(s, 1)}"] == 0, (s, role)
    torch.manual_seed(0)
    with talk(Trainer(config(tmp_path, "ray", 1, workers=RAY, **lora))) as tr:
        assert [comparable(tr.train_step()) for _ in range(3)] == local
