"""Several policies in one run (rl/policies.py) on the tiny model: one declared policy is today's self-play bit
for bit; two policies' updates equal two single-policy runs on the same rows; per-policy resume is exact;
each agent's turns are sampled by its own policy's client; bad sections fail clearly."""

import dataclasses

import numpy as np
import pytest
import torch

from palaestra.shared.config import ConfigError, TrackingConfig, check_fields
from palaestra.shared.rl import checkpoint
from palaestra.shared.rl.advantages import AdvantageStep
from palaestra.shared.rl.config import EnvSpec, OptimConfig, PolicySpec, TrainConfig
from palaestra.shared.rl.loss import LossConfig
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine, RolloutFailures, RolloutResult
from palaestra.shared.rollout.env import ENVS, Step
from palaestra.shared.testing import TakeTurns

torch.set_num_threads(1)


class Duel(TakeTurns):
    """Each answer earns its seat a reward that varies with its text (so groups of random answers have non-zero
    advantages: the updates are real policy-gradient steps); at the end the last mover gets +1, the other -1."""

    def move_reward(self, action):
        return (sum(map(ord, action)) % 7) / 10

    def step(self, action):
        other = self.agents[(self.t + 1) % 2]
        out = super().step(action)
        if out.terminated:
            mover = self.agents[(self.t - 1) % 2]
            out.rewards = {mover: 1.0 + out.rewards[mover], other: -1.0}
        return out


@pytest.fixture(autouse=True)
def duel_env():
    ENVS.register("test_policies_duel", Duel)
    yield
    ENVS.unregister("test_policies_duel")


def config(tmp_path, **kw) -> TrainConfig:
    base = dict(
        envs=[EnvSpec("test_policies_duel")],
        job="rl.train",
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        rollout=RolloutConfig(group_size=2, max_tokens_per_turn=4, temperature=1.0),
        advantages=[AdvantageStep("turn_level", {"gamma": 1.0}), AdvantageStep("agent_norm")],
        loss=LossConfig(epsilon=0.2, dual_clip=1.4, kl_coef=0.1),
        optim=OptimConfig(lr=1e-3),
        steps=2,
        tasks_per_step=2,
        checkpoint_every=0,
        ppo_epochs=2,
        minibatch_size=3,
    )
    base.update(kw)
    return TrainConfig(**base)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def timeless(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


TWO = {"a": PolicySpec(agents=["p0"]), "b": PolicySpec(agents=["p1"], optim=OptimConfig(lr=3e-4))}


def test_one_declared_policy_is_self_play_bit_for_bit(tmp_path):
    plain, declared = (
        Trainer(config(tmp_path / "plain")),
        Trainer(config(tmp_path / "one", policies={"solo": PolicySpec()})),
    )
    runs = []
    for trainer in (plain, declared):
        with trainer:
            runs.append([timeless(trainer.train_step()) for _ in range(2)])
    assert runs[0] == runs[1]
    assert same(weights(plain.policies[0].model), weights(declared.policies[0].model))
    fresh = Trainer(config(tmp_path / "fresh"))
    assert not same(weights(plain.policies[0].model), weights(fresh.policies[0].model))  # the two steps did train


def test_two_policies_update_as_two_single_policy_runs_on_the_same_rows(tmp_path):
    two = Trainer(config(tmp_path / "two", policies=TWO))
    two.prepare()
    seen: list[RolloutResult] = []
    select = two.batch_rule.select
    two.batch_rule.select = lambda step, result: seen.append(select(step, result)) or seen[-1]
    before = weights(two.policies[0].model)
    metrics = [two.train_step() for _ in range(2)]
    two.close()
    assert {t.agent for r in seen for t in r.trajectories} == {"p0", "p1"}
    for agent in ("p0", "p1"):  # rewards differ within each seat's rows: the updates follow non-zero advantages
        assert len({t.total_reward for r in seen for t in r.trajectories if t.agent == agent}) > 1
    for policy, agent, optim in (
        (two.policies[0], "p0", OptimConfig(lr=1e-3)),
        (two.policies[1], "p1", TWO["b"].optim),
    ):
        alone = Trainer(config(tmp_path / agent, optim=optim))
        alone.prepare()
        rows = [RolloutResult([t for t in r.trajectories if t.agent == agent], r.stats) for r in seen]
        alone.batch_rule.select = lambda step, result, rows=rows: rows[step]  # the same rows, this seat's alone
        single = [alone.train_step() for _ in range(2)]
        alone.close()
        assert same(weights(policy.model), weights(alone.policies[0].model)), policy.name
        assert same(policy.optimizer.state_dict()["state"][0], alone.policies[0].optimizer.state_dict()["state"][0])
        for m, s in zip(metrics, single):
            assert {k: m[f"policy/{policy.name}/{k}"] for k in timeless(s) if k.startswith("train/")} == {
                k: v for k, v in s.items() if k.startswith("train/")
            }
    # both moved from the one start, differently
    a, b = weights(two.policies[0].model), weights(two.policies[1].model)
    assert not same(a, before) and not same(b, before) and not same(a, b)
    rewards = [t.total_reward for t in seen[-1].trajectories]
    assert metrics[-1]["train/reward_mean"] == pytest.approx(np.mean(rewards))


def test_two_policies_resume_exactly(tmp_path):
    straight = Trainer(config(tmp_path / "a", policies=TWO, steps=4))
    straight.train()
    first = Trainer(config(tmp_path / "b", policies=TWO, steps=2))
    first.train()
    step_dir = checkpoint.latest(tmp_path / "b" / "out" / "checkpoints")
    assert step_dir.name == "step_000002" and (step_dir / "a" / "optimizer.pt").is_file() and (step_dir / "b").is_dir()
    assert (tmp_path / "b" / "out" / "checkpoints" / "policies" / "b" / "reference").is_dir()
    resumed = Trainer(config(tmp_path / "b", policies=TWO, steps=4, resume=True))
    resumed.train()
    assert resumed.step == 4
    for p, q in zip(straight.policies, resumed.policies):
        assert same(weights(p.model), weights(q.model)), p.name
        sp, sq = p.optimizer.state_dict()["state"], q.optimizer.state_dict()["state"]
        assert all(torch.equal(sp[i]["exp_avg_sq"], sq[i]["exp_avg_sq"]) for i in sp)
    # a run with other policies refuses the checkpoint
    other = Trainer(config(tmp_path / "b", policies={"a": PolicySpec(agents=["p0"]), "c": PolicySpec()}, resume=True))
    with pytest.raises(checkpoint.CheckpointError, match="holds policies"):
        other.resume()


class Recording:
    """A client that records the prompts it is asked to complete (everything else is the wrapped client's)."""

    def __init__(self, client):
        self.inner, self.prompts = client, []

    def generate(self, prompts, params):
        self.prompts += [list(p) for p in prompts] * params.n
        return self.inner.generate(prompts, params)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_each_agent_is_sampled_by_its_route(tiny_llm):
    first, second = Recording(tiny_llm), Recording(tiny_llm)
    cfg = RolloutConfig(group_size=2, max_tokens_per_turn=4)
    specs = [EpisodeSpec(Duel, seed=i, group_id=str(i)) for i in range(3)]
    routed = RolloutEngine(first, cfg, route=lambda agent: second if agent == "p1" else first).run(specs, seed=3)
    for agent, client in (("p0", first), ("p1", second)):
        prompts = [list(turn.prompt_ids) for t in routed.trajectories if t.agent == agent for turn in t.turns]
        assert len(prompts) == 3 * 2 * 2  # tasks x group x turns per seat
        assert sorted(client.prompts) == sorted(prompts)
    # with every agent routed to the engine's own client, the rollout is the one without a route
    plain = RolloutEngine(tiny_llm, cfg).run(specs, seed=3)
    same_client = RolloutEngine(tiny_llm, cfg, route=lambda agent: tiny_llm).run(specs, seed=3)
    ids = lambda r: [[turn.response_ids for turn in t.turns] for t in r.trajectories]  # noqa: E731
    assert ids(plain) == ids(same_client)


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ({"a": PolicySpec(agents=["p0"]), "b": PolicySpec(agents=["p0"])}, "agent 'p0' is in policies a and b"),
        ({"a": PolicySpec(), "b": PolicySpec()}, "at most one may play the agents not named"),
        ({"a/b": PolicySpec()}, "policy name 'a/b'"),
    ],
)
def test_bad_policies_sections_fail_clearly(tmp_path, policies, message):
    with pytest.raises(ConfigError, match=message):
        check_fields(config(tmp_path, policies=policies))


def test_an_agent_without_a_policy_stops_the_step(tmp_path):
    trainer = Trainer(config(tmp_path, policies={"a": PolicySpec(agents=["p0"])}))
    with pytest.raises(RolloutFailures, match="ConfigError: agent 'p1' has no policy"), trainer:
        trainer.train_step()


def test_several_policies_refuse_settings_they_do_not_support(tmp_path):
    from palaestra.shared.llm import LLMConfig

    # rollout workers serve each policy's own model as its llm: one workers.llm for all of them is ambiguous
    workers = dataclasses.replace(config(tmp_path).workers, num_workers=1, llm=LLMConfig(model="tiny"))
    own = {**TWO, "b": dataclasses.replace(TWO["b"], llm=LLMConfig(model="tiny", seed=1))}
    with pytest.raises(ConfigError, match="workers.llm names one model .* policies b have an llm"):
        Trainer(config(tmp_path, policies=own, workers=workers))


def test_plan_counts_every_policys_memory():
    """Two policies of one model hold twice its weights, gradients, AdamW moments and reference: 4 + 4 + 8 + 2
    = 18 bytes per parameter more than one policy (fp32 master weights, a bf16 reference on the GPU, KL on); a
    larger second model adds its own 18 bytes per parameter and its larger activations; LoRA adapters on one base
    add nothing."""
    from palaestra.shared.config import resolve
    from palaestra.shared.plan import plan
    from palaestra.shared.plan_memory import GB, model_arch

    base = {"job": "rl.train", "llm": {"model": "smollm2-135m", "device": "cuda"}}
    base |= {"loss": {"kl_coef": 0.01}, "learner": {"gradient_checkpointing": True, "micro_batch_tokens": 8192}}
    two = {"a": {"agents": ["p0"]}, "b": {"agents": ["p1"]}}

    def total(data):
        text, _ = plan(resolve(TrainConfig, data), gpu_gb=1000.0)
        return float(next(line for line in text.splitlines() if line.strip().startswith("total")).split()[1]), text

    one, _ = total(base)
    both, text = total({**base, "policies": two})
    params = model_arch("smollm2-135m")[0].params()
    assert both - one == pytest.approx(18 * params / GB, abs=0.011)
    assert "policies: 2, each its own model" in text
    bigger = {**two, "b": {"agents": ["p1"], "llm": {"model": "Qwen/Qwen3-4B", "device": "cuda"}}}
    mixed, _ = total({**base, "policies": bigger})
    assert mixed - one > 18 * model_arch("Qwen/Qwen3-4B")[0].params() / GB  # its held parts, and more activations
    lora = {**base, "lora": {"enabled": True}, "loss": {"kl_coef": 0.0}}
    alone, _ = total(lora)
    shared, text = total({**lora, "policies": two})
    assert shared == alone and "2 LoRA adapters on one base model" in text


def adapter(model, name: str) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def test_lora_policies_share_one_base_each_updating_its_adapter_as_a_single_lora_run(tmp_path):
    """With LoRA on one model the policies are adapters on one base: the base stays, each adapter moves as a
    single-policy LoRA run from the same adapter weights on the same rows; each generates with its adapter (as
    the base with that adapter merged in); a resumed run gets every adapter and optimizer back."""
    from peft import set_peft_model_state_dict

    from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
    from palaestra.shared.llm.lora import LoraConfig
    from palaestra.shared.rl.policies import adapter_states

    lora = LoraConfig(enabled=True, r=4, alpha=8)
    two = Trainer(config(tmp_path / "two", policies=TWO, lora=lora))
    a, b = two.policies
    assert a.model is b.model and (a.adapter, b.adapter) == ("policy_a", "policy_b")
    base = {k: v.clone() for k, v in weights(a.model).items() if "lora_" not in k}
    two.prepare()
    start_b = adapter(b.model, b.adapter)
    seen: list[RolloutResult] = []
    select = two.batch_rule.select
    two.batch_rule.select = lambda step, result: seen.append(select(step, result)) or seen[-1]
    for _ in range(2):
        two.train_step()
    assert same(base, {k: v for k, v in weights(a.model).items() if "lora_" not in k})
    assert not same(adapter(b.model, b.adapter), start_b)
    # policy b against a single-policy LoRA run started from b's adapter, on p1's rows
    alone = Trainer(config(tmp_path / "alone", optim=TWO["b"].optim, lora=lora))
    alone.prepare()
    set_peft_model_state_dict(alone.policies[0].model, start_b)
    rows = [RolloutResult([t for t in r.trajectories if t.agent == "p1"], r.stats) for r in seen]
    alone.batch_rule.select = lambda step, result: rows[step]
    for _ in range(2):
        alone.train_step()
    alone.close()
    assert same(adapter(b.model, b.adapter), adapter(alone.policies[0].model, "default"))
    # generation with b's adapter is the base with b merged in
    merged = make_client(LLMConfig(model="tiny", device="cpu"))
    b.model.set_adapter(b.adapter)
    merged.model.load_state_dict(checkpoint.merged_lora_state(b.model))
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    prompt = [two.client.render([{"role": "user", "content": "move 0"}], add_generation_prompt=True)]
    a.model.set_adapter(a.adapter)
    assert b.client.generate(prompt, greedy)[0].token_ids == merged.generate(prompt, greedy)[0].token_ids
    a.model.set_adapter(a.adapter)  # and scoring through its client's model, whatever adapter was active
    with torch.no_grad():
        ours, plain = (
            b.client.model(input_ids=torch.tensor(prompt)).logits,
            merged.model(input_ids=torch.tensor(prompt)).logits,
        )
    assert torch.allclose(ours, plain, atol=1e-5)
    # the weight sync of adapters: their tensors alone
    payload = adapter_states(two.policies)
    assert set(payload) == {"policy_a", "policy_b"} and all("lora_" in k for s in payload.values() for k in s)
    assert sum(v.numel() for s in payload.values() for v in s.values()) < 0.2 * sum(t.numel() for t in base.values())
    two.save()
    two.close()
    resumed = Trainer(config(tmp_path / "two", policies=TWO, lora=lora, resume=True))
    resumed.prepare()
    for p, q in zip(two.policies, resumed.policies):
        assert same(adapter(p.model, p.adapter), adapter(q.model, q.adapter))
        assert same(p.optimizer.state_dict()["state"][0], q.optimizer.state_dict()["state"][0])
    resumed.close()


def test_a_rollout_worker_serves_the_lora_policies_from_their_adapters_alone(tmp_path):
    """A rollout worker (here in this process) given the adapters' settings and, as its weight sync, the
    adapters' tensors alone plays every agent as the learner's own rollouts do, token for token."""
    from palaestra.shared.llm import LLMConfig
    from palaestra.shared.llm.lora import LoraConfig
    from palaestra.shared.rl.policies import worker_serving
    from palaestra.shared.rollout.workers import RolloutWorker

    trainer = Trainer(config(tmp_path, policies=TWO, lora=LoraConfig(enabled=True, r=4, alpha=8)))
    with trainer:
        trainer.train_step()
        payload = trainer.policy_state()
        assert set(payload) == {"policy_a", "policy_b"} and all("lora_" in k for s in payload.values() for k in s)
        worker = RolloutWorker(
            LLMConfig(model="tiny", device="cpu"), trainer.cfg.rollout, 1, worker_serving(trainer.policies)
        )
        worker.load_weights(payload, trainer.step)
        specs = [EpisodeSpec(Duel, seed=i, group_id=str(i)) for i in range(2)]
        ours, theirs = trainer.rollouts.run(specs, seed=5), worker.run(specs, seed=5)
    ids = lambda r: [(t.agent, [turn.response_ids for turn in t.turns]) for t in r.trajectories]  # noqa: E731
    assert ids(ours) == ids(theirs) and {a for a, _ in ids(ours)} == {"p0", "p1"}


@pytest.mark.slow  # a Ray actor with a model replica
def test_ray_workers_train_lora_policies_with_adapter_only_syncs(tmp_path, ray_local):
    """Over Ray: every sync sends the adapters' tensors alone, and the worker's rollout (the task env's one
    agent, played by policy b) equals this process's worker with the same adapters."""
    from palaestra.shared.llm import LLMConfig
    from palaestra.shared.llm.lora import LoraConfig
    from palaestra.shared.rl.config import WorkersConfig
    from palaestra.shared.rl.policies import worker_serving
    from palaestra.shared.rollout.workers import RayRollouts, RolloutWorker

    policies = {"a": PolicySpec(agents=["nobody"]), "b": PolicySpec()}  # b plays every other agent
    cfg = config(
        tmp_path,
        envs=[EnvSpec("task", {"reward": "exact_answer"})],  # built in: the worker process knows it
        policies=policies,
        lora=LoraConfig(enabled=True, r=4, alpha=8),
        workers=WorkersConfig(num_workers=1),
        advantages=[AdvantageStep("grpo")],
    )
    payloads = []
    sync = RayRollouts.sync
    with Trainer(cfg) as trainer:
        trainer.prepare()
        trainer.rollouts.sync = lambda state, version=None: (
            payloads.append(state) or sync(trainer.rollouts, state, version)
        )
        metrics = trainer.train_step()
        assert "policy/b/train/loss" in metrics and "policy/a/train/loss" not in metrics
        specs = trainer.draw_tasks(7)
        theirs = trainer.rollouts.run(specs, seed=3)
        local = RolloutWorker(LLMConfig(model="tiny", device="cpu"), cfg.rollout, 1, worker_serving(trainer.policies))
        local.load_weights(trainer.policy_state(), trainer.step)
        ours = local.run(specs, seed=3 * 1009)  # the seed of the pool's first (only) shard
    assert payloads and all(set(p) == {"policy_a", "policy_b"} for p in payloads)
    assert all("lora_" in k for p in payloads for s in p.values() for k in s)
    ids = lambda r: [[turn.response_ids for turn in t.turns] for t in r.trajectories]  # noqa: E731
    assert ids(ours) == ids(theirs)


def test_solver_critic_env_plays_in_turn_and_rewards_the_team():
    from palaestra.shared.rollout.solver_critic import SolverCriticEnv

    env = SolverCriticEnv("next_number", "exact_answer", {"num_samples": 1}, rounds=2)  # "Next number: 0 1 2" -> 3
    env.reset(seed=0)
    assert env.current_agent == "solver" and env.observe("solver") == [
        {"role": "user", "content": "Next number: 0 1 2"}
    ]
    assert env.step("4") == Step(rewards={}, info={"action": "4"})
    assert env.current_agent == "critic"
    critique = env.observe("critic")[0]["content"]
    assert "Next number: 0 1 2" in critique and "answered: 4" in critique
    env.step("It is 3.")
    assert env.observe("solver")[0]["content"].startswith("The critic says: It is 3.")
    last = env.step("3")
    assert last.terminated and last.rewards == {"solver": 1.0, "critic": 1.0}
    env.reset(seed=0)
    env.observe("solver")
    for action in ("3", "no", "5"):  # right first, wrong last: the last answer counts
        last = env.step(action)
    assert last.rewards == {"solver": 0.0, "critic": 0.0}
    one = SolverCriticEnv("next_number", rounds=1)  # one solver turn: the task env with a critic that never speaks
    one.reset(seed=0)
    assert one.step("3").terminated


def test_solver_critic_warm_start_data_is_balanced_over_the_answers():
    """Every task pairs every first answer with every critique; the critic's replies name each answer equally often
    per task, and the solver's final answer is the critique's (so the data says nothing of which is right)."""
    from collections import Counter

    from palaestra.shared.rollout.tasks import TASKS

    kwargs = {"steps": [1], "max_start": 3, "num_samples": 4}
    tasks = TASKS.get("next_number")(**kwargs)
    data = TASKS.get("solver_critic_format")("next_number", **kwargs)
    answers = {s["answer"] for s in tasks}
    assert len(data) == 2 * len(tasks) * len(answers) ** 2
    solver = [d["messages"] for d in data if len(d["messages"]) == 4]
    critic = [d["messages"] for d in data if len(d["messages"]) == 2]
    assert all(m[2]["content"].startswith(f"The critic says: It is {m[3]['content']}.") for m in solver)
    for task in tasks:
        said = Counter(m[1]["content"] for m in critic if task["messages"][0]["content"] in m[0]["content"])
        assert said == {f"It is {a}.": len(answers) for a in answers}


def test_solver_and_critic_as_lora_policies_train_in_one_step(tmp_path):
    from palaestra.shared.llm.lora import LoraConfig

    roles = {"solver": PolicySpec(agents=["solver"]), "critic": PolicySpec(agents=["critic"])}
    cfg = config(
        tmp_path,
        envs=[EnvSpec("solver_critic", {"source": "next_number", "rounds": 2})],
        policies=roles,
        lora=LoraConfig(enabled=True, r=4, alpha=8),
    )
    with Trainer(cfg) as trainer:
        metrics = trainer.train_step()
    assert metrics["rollout/trajectories"] == 2 * 2 * 2  # tasks x group x roles
    assert all(np.isfinite(metrics[f"policy/{role}/train/loss"]) for role in roles)
