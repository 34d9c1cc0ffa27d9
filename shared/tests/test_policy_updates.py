"""`update_policies`: several policies' updates at once when each learner is ranks of its own, else in turn.

Concurrency is shown without timing: each update waits at a barrier for the other, which only passes when both
run at the same time. The control: policies whose learners share this process (or LoRA adapters on one base)
update one after another, in order, on the calling thread."""

import threading
from types import SimpleNamespace

import pytest

from palaestra.shared.rl.policies import update_policies


def policies(world_size: int, adapter: str | None = None):
    return [SimpleNamespace(name=n, adapter=adapter, learner=SimpleNamespace(world_size=world_size)) for n in "ab"]


def test_policies_with_ranks_of_their_own_update_at_once():
    barrier = threading.Barrier(2, timeout=10)

    def update(policy, rows):
        barrier.wait()  # BrokenBarrierError unless the other policy's update runs meanwhile
        return policy.name + rows

    splits = [(p, p.name.upper()) for p in policies(world_size=2)]
    assert [(p.name, m) for p, m in update_policies(splits, update)] == [("a", "aA"), ("b", "bB")]


@pytest.mark.parametrize("world_size, adapter", [(1, None), (2, "policy_a")])
def test_policies_sharing_a_device_or_a_base_update_in_turn(world_size, adapter):
    seen = []

    def update(policy, rows):
        seen.append((policy.name, threading.current_thread() is threading.main_thread()))
        return rows

    splits = [(p, p.name) for p in policies(world_size, adapter)]
    assert [m for _, m in update_policies(splits, update)] == ["a", "b"]
    assert seen == [("a", True), ("b", True)]


def test_an_error_in_one_concurrent_update_reaches_the_caller():
    def update(policy, rows):
        if policy.name == "b":
            raise RuntimeError("policy b's loss is not finite")
        return rows

    with pytest.raises(RuntimeError, match="policy b's loss"):
        update_policies([(p, p.name) for p in policies(world_size=2)], update)
