"""Bounded-staleness rollouts (rl/async_rollouts.py): the behaviour correction against a re-implementation,
version tags across a weight update mid-episode, the synchronous loop at staleness 0, the overlap at 1."""

import copy
import math

import pytest
import torch

from palaestra.shared.config import ConfigError
from palaestra.shared.llm.base import LLMConfig, make_client
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rl.async_rollouts import async_metrics
from palaestra.shared.rl.config import EnvSpec, TrainConfig
from palaestra.shared.rl.loss import LossConfig, policy_loss
from palaestra.shared.rl.trainer import Trainer
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.rollout.policy_version import PolicyVersion
from palaestra.shared.testing import small_train_config

torch.set_num_threads(1)


# -- the correction, against a per-token re-implementation -------------------------------------------------
def reference_loss(logps, old, behaviour, adv, mask, mode, c, eps=0.2):
    """Written from verl's / AReaL's descriptions: w = π_old/μ per token; TIS multiplies the token's PPO loss
    by min(w, C), MIS drops (zero loss) tokens with w > C or w < 1/C; grpo reduction (mean over a sequence's
    tokens, then over sequences)."""
    rows = []
    for i in range(len(logps)):
        total, count = 0.0, 0
        for j in range(len(logps[i])):
            if not mask[i][j]:
                continue
            count += 1
            rho = math.exp(logps[i][j] - old[i][j])
            a = adv[i][j]
            token = -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
            w = math.exp(old[i][j] - behaviour[i][j])
            if mode == "tis":
                token *= min(w, c)
            elif mode == "mis" and (w > c or w < 1 / c):
                token = 0.0
            total += token
        rows.append(total / max(count, 1))
    return sum(rows) / len(rows)


@pytest.mark.parametrize("mode", ["off", "tis", "mis"])
def test_correction_equals_a_per_token_reimplementation(mode):
    gen = torch.Generator().manual_seed(3)
    shape = (4, 7)
    old = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    logps = old + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
    behaviour = old + 1.2 * torch.randn(shape, generator=gen, dtype=torch.float64)  # ratios well beyond C = 2
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = (torch.rand(shape, generator=gen) > 0.2).double()
    cfg = LossConfig(behaviour_correction=mode, behaviour_threshold=2.0)
    loss, _ = policy_loss(logps, old, adv, mask, cfg, behaviour_logps=behaviour)
    expected = reference_loss(logps.tolist(), old.tolist(), behaviour.tolist(), adv.tolist(), mask.tolist(), mode, 2.0)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    if mode != "off":  # the correction changes this batch's loss
        plain = reference_loss(logps.tolist(), old.tolist(), behaviour.tolist(), adv.tolist(), mask.tolist(), "off", 2)
        assert abs(expected - plain) > 1e-3


def test_correction_weights_are_detached():
    """The weight is a constant factor: the gradient is min(w, C) times the plain token's gradient."""
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, behaviour = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-2.5, -1.9]])
    adv, mask = torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    loss, _ = policy_loss(logps, old, adv, mask, LossConfig(behaviour_correction="tis"), behaviour_logps=behaviour)
    loss.backward()
    w = [min(math.exp(1.5), 2.0), math.exp(-0.1)]
    assert logps.grad.tolist()[0] == pytest.approx([-wi / 2 for wi in w])  # d(-ρA)/dlogπ = -ρA = -1 at ρ = 1


def test_async_metrics_count_lags_and_corrections():
    versions = torch.tensor([[3, 3, 2, -1], [1, 1, -1, -1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    old = torch.zeros(2, 4)
    behaviour = torch.tensor([[0.0, -1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # w = 1, e, 1/e, -, 1, 1
    m = async_metrics(3, versions, mask, 2, LossConfig(behaviour_correction="mis"), old, behaviour)
    assert (m["async/tokens_lag_0"], m["async/tokens_lag_1"], m["async/tokens_lag_2"]) == (2, 1, 2)
    assert m["async/staleness_max"] == 2 and m["async/staleness_mean"] == pytest.approx(5 / 5)
    assert m["async/truncated_share"] == pytest.approx(1 / 5) and m["async/masked_share"] == pytest.approx(2 / 5)
    assert m["async/corrected_share"] == m["async/masked_share"]
    assert m["async/logp_gap_abs"] == pytest.approx(2 / 5)


def test_correction_needs_untempered_scoring():
    """Raw log-probs (the default): the learner scores at 1.0 and the rollout samples untempered
    (test_resolve_choices.py has the processed mode's cases)."""
    with pytest.raises(ConfigError, match="logprobs_mode=raw logs the untempered model"):
        TrainConfig(rollout=RolloutConfig(temperature=0.7), loss=LossConfig(behaviour_correction="tis"))
    with pytest.raises(ConfigError, match="set loss.logprob_temperature=1.0"):
        TrainConfig(loss=LossConfig(behaviour_correction="tis", logprob_temperature=0.7))
    TrainConfig(loss=LossConfig(behaviour_correction="tis", logprob_temperature=1.0))
    TrainConfig(loss=LossConfig(behaviour_correction="tis"))  # None: the rollout's temperature, 1.0


# -- versions across an update mid-episode -------------------------------------------------------------------
class Talk(TextEnv):
    """Three turns of one agent; after the first, a callback (the learner's weight sync) fires."""

    on_first_step = None

    def reset(self, seed=None):
        self.turn = 0
        return {}

    def observe(self, agent):
        return [{"role": "user", "content": f"turn {self.turn}"}]

    def step(self, action):
        self.turn += 1
        if self.turn == 1 and Talk.on_first_step is not None:
            Talk.on_first_step()
        return Step({"agent": 1.0}, terminated=self.turn == 3)


def test_versions_survive_a_partial_episode_across_an_update():
    client = make_client(LLMConfig(model="tiny"))
    engine = RolloutEngine(client, RolloutConfig(group_size=2, max_tokens_per_turn=4, max_turns=5))
    old_model, new_model = copy.deepcopy(client.model), copy.deepcopy(client.model)
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    offered = []

    def sync_once():
        if not offered:  # version 1 arrives while the episodes are half played
            engine.policy.offer(new_model.state_dict(), 1)
            offered.append(1)

    Talk.on_first_step = sync_once
    try:
        result = engine.run([EpisodeSpec(Talk, seed=0, group_id="g")], seed=5)
    finally:
        Talk.on_first_step = None
    assert len(result.trajectories) == 2
    for traj in result.trajectories:
        assert len(traj.turns) == 3  # nothing discarded: the episode went on with the new weights
        assert [set(t.response_versions) for t in traj.turns] == [{0}, {1}, {1}]
        seq = traj.to_sequence()
        assert [v for v, m in zip(seq.versions, seq.loss_mask) if m] == sum(
            (t.response_versions for t in traj.turns), []
        )
        # the later turns were sampled by the new weights: their logprobs are the new model's, not the old one's
        last = traj.turns[-1]
        ids = torch.tensor([last.prompt_ids + last.response_ids])
        start = len(last.prompt_ids)
        for model, equal in ((new_model, True), (old_model, False)):
            with torch.no_grad():
                logits = model(ids).logits[0, start - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, start:, None]).squeeze(-1)
            close = torch.allclose(lp, torch.tensor(last.response_logprobs), atol=1e-4)
            assert close == equal


# -- the trainer -------------------------------------------------------------------------------------------
@REWARDS.register("async_test_length")
def response_length(sample, completion, **info) -> float:
    return len(completion) / 10


def config(tmp_path, **kw) -> TrainConfig:
    return small_train_config(tmp_path, "async_test_length", **{"steps": 3, **kw})


def test_staleness_zero_samples_each_step_with_the_previous_updates_weights(tmp_path):
    """The synchronous loop: step 1's tokens are version 1, sampled by the weights after step 0's update (the
    same tokens when the engine replays step 1's tasks and seed on a copy of those weights)."""
    with Trainer(config(tmp_path, loss=LossConfig(behaviour_correction="tis", logprob_temperature=1.0))) as tr:
        tr.train_step()
        after_first = copy.deepcopy(tr.policies[0].model.state_dict())
        taken = []
        stream = tr.stream
        original = stream.take
        stream.take = lambda step: taken.append(original(step)) or taken[-1]
        metrics = tr.train_step()
        client = make_client(LLMConfig(model="tiny"))
        client.load_weights(after_first)
        replay = RolloutEngine(client, tr.cfg.rollout).run(tr.draw_tasks(1), seed=tr.cfg.seed * 100_003 + 1)
    got = [t.turns[-1].response_ids for t in taken[0].trajectories]
    assert got == [t.turns[-1].response_ids for t in replay.trajectories]
    assert {v for t in taken[0].trajectories for v in t.turns[-1].response_versions} == {1}
    assert metrics["async/staleness_max"] == 0 and metrics["async/logp_gap_abs"] < 1e-4


def test_staleness_one_overlaps_in_a_background_thread(tmp_path):
    cfg = config(tmp_path, rollout=RolloutConfig(group_size=3, max_tokens_per_turn=5, max_staleness=1))
    with Trainer(cfg) as tr:
        history = [tr.train_step() for _ in range(3)]
    tokens = [h["rollout/response_tokens_mean"] * h["rollout/trajectories"] for h in history]
    for h, n in zip(history, tokens):
        assert h["async/staleness_max"] <= 1
        assert h["async/tokens_lag_0"] + h["async/tokens_lag_1"] == n  # every token has a lag of at most 1
    # step 1's rollout started before step 0's update: its first tokens are version 0, one step stale
    assert history[1]["async/tokens_lag_1"] > 0 and history[1]["async/logp_gap_abs"] > 0


def test_an_older_offer_never_rolls_the_weights_back():
    class Client:
        loaded: list = []

        def load_weights(self, state):
            self.loaded.append(state)

    policy = PolicyVersion(Client())
    policy.offer({"w": 2}, 2)
    policy.offer({"w": 1}, 1)  # arrived late (another thread of a concurrent actor)
    with policy.generating() as version:
        assert version == 2
    policy.offer({"w": 1}, 1)
    with policy.generating() as version:
        assert version == 2
    assert Client.loaded == [{"w": 2}]


def test_no_rollout_starts_past_the_last_step(tmp_path):
    cfg = config(tmp_path, steps=2, rollout=RolloutConfig(group_size=2, max_tokens_per_turn=3, max_staleness=2))
    with Trainer(cfg) as tr:
        tr.prepare()
        drawn = []
        draw = tr.stream.draw
        tr.stream.draw = lambda step: drawn.append(step) or draw(step)
        tr.train()
    assert drawn == [0, 1]


# -- the fixed version schedule and resume ---------------------------------------------------------------------
def _fixed(tmp_path, name: str, k: int, **kw) -> TrainConfig:
    rollout = RolloutConfig(group_size=2, max_tokens_per_turn=4, max_staleness=k, version_schedule="fixed")
    loss = LossConfig(behaviour_correction="tis", logprob_temperature=1.0)
    return config(tmp_path / name, rollout=rollout, loss=loss, steps=4, **kw)


def _comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # wall times differ


@pytest.mark.parametrize("k", [1, 2])
def test_fixed_schedule_resumes_bit_exact(tmp_path, k):
    """4 steps straight vs 2 steps, a checkpoint (with the rollouts in flight), a new trainer resuming, 2 more:
    the same metrics and weights, bit for bit. The schedule: step s samples with version max(0, s - k) only."""
    with Trainer(_fixed(tmp_path, "straight", k)) as tr:
        straight = [tr.train_step() for _ in range(4)]
        final = copy.deepcopy(tr.policies[0].model.state_dict())
    for s, m in enumerate(straight):
        tokens = m["rollout/response_tokens_mean"] * m["rollout/trajectories"]
        assert m[f"async/tokens_lag_{min(s, k)}"] == tokens  # every token of step s: version max(0, s - k)
    with Trainer(_fixed(tmp_path, "cut", k)) as tr:
        first = [tr.train_step() for _ in range(2)]
        saved = tr.save()
    assert (saved / "rollouts_ahead.pkl").is_file()  # steps 2.. were in flight
    with Trainer(_fixed(tmp_path, "cut", k, resume=True)) as tr:
        tr.prepare()
        assert tr.step == 2 and sorted(tr.stream.inflight) == list(range(2, 2 + k))
        resumed = [tr.train_step() for _ in range(2)]
        after = tr.policies[0].model.state_dict()
    assert [_comparable(m) for m in first + resumed] == [_comparable(m) for m in straight]
    assert after.keys() == final.keys() and all(torch.equal(after[n], final[n]) for n in final)


# -- admission control per task source, groups whole -------------------------------------------------------------
class Uneven(TextEnv):
    """A group's members end at different turns: the n-th env built plays n % 3 + 1 turns."""

    built = 0

    def reset(self, seed=None):
        self.turns, self.turn = Uneven.built % 3 + 1, 0
        Uneven.built += 1
        return {}

    def observe(self, agent):
        return [{"role": "user", "content": f"turn {self.turn}"}]

    def step(self, action):
        self.turn += 1
        return Step({"agent": float(self.turn)}, terminated=self.turn == self.turns)


def test_admission_bounds_a_source_and_defers_without_discarding():
    import functools

    from palaestra.shared.rl.async_rollouts import RolloutStream, task_source
    from palaestra.shared.rl.episodes import make_env
    from palaestra.shared.rollout.engine import RolloutResult
    from palaestra.shared.rollout.workers import LocalRollouts

    def spec(step, i, source):
        return EpisodeSpec(functools.partial(make_env, "task", {"source": source}), i, f"{step}-{i}")

    # step 2 alone holds 3 tasks of `slow`, more than its bound of 2: it still starts when the learner takes it
    mix = {0: ["slow", "fast"], 1: ["slow", "fast"], 2: ["slow"] * 3, 3: ["fast"], 4: ["slow", "slow"], 5: ["fast"]}

    class Engine:
        policy = None

        def run(self, specs, seed):
            return RolloutResult([], {"groups": [s.group_id for s in specs]})

    draw = lambda step: [spec(step, i, src) for i, src in enumerate(mix[step])]  # noqa: E731
    assert task_source(draw(0)[0]) == "slow" and task_source(EpisodeSpec(Talk, 0, "x")) == "Talk"
    stream = RolloutStream(
        LocalRollouts(make_client(LLMConfig(model="tiny")), RolloutConfig()),
        max_staleness=3,
        draw=draw,
        seed=lambda step: step,
        local_engine=Engine,
        steps=6,
        max_inflight={"slow": 2},
    )
    order, results = [], []
    for step in range(6):
        results.append(stream.take(step))
        order.append(sorted(set(range(step + 1)) | set(stream.inflight)))  # the steps started so far
    stream.close()
    # an independent replay of the rule: in order, the steps up to t + 3 whose slow tasks fit beside those in flight
    expected, flight, nxt = [], {}, 0
    for t in range(6):
        while nxt <= min(t + 3, 5):
            need = mix[nxt].count("slow")
            if nxt > t and need and sum(flight.values()) + need > 2:  # a step without slow tasks never waits
                break
            flight[nxt], nxt = need, nxt + 1
        flight.pop(t)
        expected.append(list(range(nxt)))
    assert order == expected and order[0] == [0, 1] and order[1] == [0, 1]  # step 2 waits for its turn
    # nothing discarded: every step's result is its own tasks, all of them
    assert [r.stats["groups"] for r in results] == [[f"{s}-{i}" for i in range(len(mix[s]))] for s in range(6)]


def test_a_group_comes_back_whole_when_its_last_member_ends(tmp_path):
    """At staleness 1, each step's rollout holds every member of every group, also those that played more
    turns than the others (the GRPO advantage is taken over the whole group)."""
    cfg = config(tmp_path, envs=[EnvSpec("task", {"reward": "async_test_length"})], steps=2)
    cfg.rollout = RolloutConfig(group_size=3, max_tokens_per_turn=3, max_turns=4, max_staleness=1)
    with Trainer(cfg) as tr:
        tr.prepare()
        tr.stream.draw = lambda step: [EpisodeSpec(Uneven, seed=i, group_id=f"{step}-{i}") for i in range(2)]
        taken = []
        original = tr.stream.take
        tr.stream.take = lambda step: taken.append(original(step)) or taken[-1]
        tr.train()
    for step, result in enumerate(taken):
        turns: dict[str, list[int]] = {}
        for t in result.trajectories:
            turns.setdefault(t.group_id, []).append(len(t.turns))
        assert sorted(turns) == [f"{step}-0", f"{step}-1"]
        assert all(sorted(n) == [1, 2, 3] for n in turns.values())  # members that ended at turns 1, 2 and 3


def test_admission_bounds_name_sources_of_the_mixture(tmp_path):
    from palaestra.shared.rl.async_rollouts import check_admission

    cfg = config(tmp_path, envs=[EnvSpec("task", {"source": "next_number", "reward": "async_test_length"})])
    cfg.rollout.max_inflight = {"next_number": 4}
    check_admission(cfg)
    cfg.rollout.max_inflight = {"bfcl": 4}
    with pytest.raises(ConfigError, match=r"names \['bfcl'\].*\['next_number'\]"):
        check_admission(cfg)
    cfg.rollout.max_inflight = {"next_number": 0}
    with pytest.raises(ConfigError, match=">= 1"):
        check_admission(cfg)


def test_rollouts_in_flight_that_do_not_pickle_are_left_out_of_the_checkpoint(tmp_path):
    from palaestra.shared.rl.async_rollouts import AHEAD_FILE, RolloutStream
    from palaestra.shared.rollout.engine import RolloutResult
    from palaestra.shared.rollout.trajectory import Trajectory

    stream = RolloutStream(None, 0, draw=lambda step: [], seed=lambda step: step)
    stream.inflight[3] = RolloutResult([Trajectory("task", "agent", "3-0", info={"f": lambda: 0})], {})
    with pytest.warns(UserWarning, match=r"starts steps \[3\] again"):
        stream.save(tmp_path)
    assert not (tmp_path / AHEAD_FILE).exists()
    stream.inflight[3].trajectories[0].info = {"f": 0}
    stream.save(tmp_path)
    fresh = RolloutStream(None, 0, draw=lambda step: [], seed=lambda step: step)
    fresh.restore(tmp_path)
    assert fresh.inflight[3].trajectories[0].info == {"f": 0} and fresh.take(3) is not None and not fresh.inflight
