"""Interruptible generation in the rollouts (rollout/engine.py with rollout/policy_version.py): under the ``newest``
schedule ahead of the learner, weights offered while a transformers client generates land at the next token
boundary. A rollout whose update lands after token SWITCH tags each token with the version that sampled it, and
its tokens equal a reference written apart from the decode loop that switches weights at that token
(`switching_reference`). Negative controls: without an update the tokens are the non-switching reference's; the
``fixed`` schedule never interrupts (an offer made mid-call waits for the next call)."""

import functools
import threading

import pytest

from palaestra.shared.llm import LLMConfig, SamplingParams, make_client
from palaestra.shared.rl.episodes import make_env
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.rollout.policy_version import PolicyVersion
from palaestra.shared.testing import switching_reference, two_weight_versions

MAX_TOKENS, SWITCH, SEED = 10, 4, 7


@pytest.fixture(scope="module")
def weights():
    return two_weight_versions()


def rollout(client, schedule: str = "newest"):
    """An engine one step ahead of the learner (k 1) on `client`: 2 tasks x groups of 2, one 10-token turn each."""
    cfg = RolloutConfig(
        group_size=2, max_turns=1, max_tokens_per_turn=MAX_TOKENS, temperature=0.8, top_k=30, max_staleness=1
    )
    cfg.version_schedule = schedule  # type: ignore[assignment]  # the StrEnum's value
    engine = RolloutEngine(client, cfg)
    specs = [EpisodeSpec(functools.partial(make_env, "task", {}), seed=i, group_id=str(i)) for i in range(2)]
    return engine, specs


def references(client, old, new, trajs):
    """The switching and the non-switching reference of the rollout's one generate call (its prompts, n 2)."""
    prompts = [t.turns[0].prompt_ids for t in trajs[::2]]
    params = SamplingParams(temperature=0.8, top_k=30, max_tokens=MAX_TOKENS, n=2, seed=SEED * 1_000_003)
    return (
        switching_reference(client, old, new, prompts, params, SWITCH),
        switching_reference(client, old, new, prompts, params, None),
    )


def test_an_update_inside_a_response_switches_its_versions_and_tokens(weights):
    client, old, new = weights
    client.model.load_state_dict(old)
    engine, specs = rollout(client)
    policy, calls = engine.policy, []
    asked = policy.at_boundary

    def update_after_switch() -> int:  # the learner's sync arrives after token SWITCH of the call
        calls.append(1)
        if len(calls) == SWITCH + 1:
            policy.offer(new, 1)
        return asked()

    policy.at_boundary = update_after_switch  # type: ignore[method-assign]
    trajs = engine.run(specs, seed=SEED).trajectories
    client.model.load_state_dict(old)
    switched, unswitched = references(client, old, new, trajs)
    got = [t.turns[0].response_ids for t in trajs]
    assert got == switched
    for t in trajs:
        n = len(t.turns[0].response_ids)
        assert t.turns[0].response_versions == [0] * min(n, SWITCH) + [1] * max(0, n - SWITCH)
    long_rows = [i for i, ids in enumerate(got) if len(ids) > SWITCH]
    assert long_rows, "no response outlived the update: the test would check nothing"
    assert any(got[i] != unswitched[i][: len(got[i])] for i in long_rows)  # the update changed the tokens
    assert policy.version == 1


def test_offers_from_another_thread_land_mid_call_and_loads_wait_for_it(weights):
    """The locking: the learner's `offer` from its own thread never waits for the generate call in flight (it lands
    at the next boundary), while a `load_now` (a weight load between rollouts) waits until the call ends."""
    client, old, new = weights
    client.model.load_state_dict(old)
    engine, specs = rollout(client)
    policy, calls, threads = engine.policy, [], {}
    asked = policy.at_boundary

    def learner_thread_offers() -> int:
        calls.append(1)
        if len(calls) == SWITCH + 1:
            threads["offer"] = threading.Thread(target=policy.offer, args=(new, 1))
            threads["load"] = threading.Thread(target=policy.load_now, args=(new, 1))
            threads["offer"].start(), threads["load"].start()
            threads["offer"].join(timeout=10)
            threads["load"].join(timeout=0.2)
            assert not threads["offer"].is_alive(), "offer waited for the generate call: a deadlock"
            assert threads["load"].is_alive(), "load_now ran inside the generate call"
        return asked()

    policy.at_boundary = learner_thread_offers  # type: ignore[method-assign]
    trajs = engine.run(specs, seed=SEED).trajectories
    threads["load"].join(timeout=10)
    client.model.load_state_dict(old)
    assert not threads["load"].is_alive() and policy.version == 1
    switched, _ = references(client, old, new, trajs)
    assert [t.turns[0].response_ids for t in trajs] == switched  # the offer landed at token SWITCH
    n = len(trajs[0].turns[0].response_ids)
    assert trajs[0].turns[0].response_versions == [0] * min(n, SWITCH) + [1] * max(0, n - SWITCH)


def test_without_an_update_the_tokens_are_the_unswitched_reference(weights):
    client, old, new = weights
    client.model.load_state_dict(old)
    engine, specs = rollout(client)
    trajs = engine.run(specs, seed=SEED).trajectories
    switched, unswitched = references(client, old, new, trajs)
    got = [t.turns[0].response_ids for t in trajs]
    assert got == unswitched and got != switched
    assert all(t.turns[0].response_versions == [0] * len(t.turns[0].response_ids) for t in trajs)


@pytest.mark.parametrize("schedule", ["newest", "fixed"])
def test_fixed_never_interrupts(weights, monkeypatch, schedule):
    """An offer made inside the generate call (after its weights loaded): ``newest`` takes it at the first
    boundary, ``fixed`` keeps the call's weights and loads it at the next call."""
    client, old, new = weights
    client.model.load_state_dict(old)
    engine, specs = rollout(client, schedule)
    plain = client.generate

    def offer_mid_call(prompts, params, **kw):
        engine.policy.offer(new, 1)
        return plain(prompts, params, **kw)

    monkeypatch.setattr(client, "generate", offer_mid_call)
    trajs = engine.run(specs, seed=SEED).trajectories
    monkeypatch.undo()
    client.model.load_state_dict(old)
    prompts = [t.turns[0].prompt_ids for t in trajs[::2]]
    params = SamplingParams(temperature=0.8, top_k=30, max_tokens=MAX_TOKENS, n=2, seed=SEED * 1_000_003)
    expected = switching_reference(client, old, new, prompts, params, 0 if schedule == "newest" else None)
    assert [t.turns[0].response_ids for t in trajs] == expected
    version = 1 if schedule == "newest" else 0
    assert all(t.turns[0].response_versions == [version] * len(t.turns[0].response_ids) for t in trajs)
    assert engine.policy.version == version
    with engine.policy.generating() as held:  # fixed: the offer waited for the next call
        assert held == 1


def test_a_client_that_cannot_be_interrupted_is_not_asked(weights):
    client, old, _ = weights
    hf = make_client(LLMConfig(model="tiny", device="cpu", dtype="float32", hf_generate=True))
    hf.model.load_state_dict(old)
    assert client.interruptible and not hf.interruptible
    engine, specs = rollout(hf)
    result = engine.run(specs, seed=SEED)
    assert result.stats["failed"] == 0  # passed at_boundary, generate would raise "needs the decode loop"
    assert all(t.turns[0].response_versions == [0] * len(t.turns[0].response_ids) for t in result.trajectories)


def test_at_boundary_only_inside_generating():
    policy = PolicyVersion(client=None, version=3)
    with pytest.raises(RuntimeError, match="inside generating"):
        policy.at_boundary()
    with policy.generating():
        policy.offer(None, 4)
        assert policy.at_boundary() == 4
