"""Ray helpers: ordered parallel map, failures kept per item, a dead worker retried."""

import os

import pytest

from palaestra.shared.cluster import TaskFailure, parallel_map
from palaestra.shared.testing import TEST_CLUSTER


def square(x):
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError("three is bad")
    return x


def die_once(path):
    # the first attempt kills its worker process outright; Ray's retry runs it again
    if not os.path.exists(path):
        open(path, "w").close()
        os._exit(1)
    return "survived"


def test_parallel_map_keeps_order(ray_local):
    assert parallel_map(square, range(6), cluster=TEST_CLUSTER, progress=False) == [0, 1, 4, 9, 16, 25]


def test_failures_raise_or_are_kept(ray_local):
    with pytest.raises(Exception, match="three is bad"):
        parallel_map(fail_on_three, range(5), progress=False)
    out = parallel_map(fail_on_three, range(5), keep_going=True, progress=False)
    assert out[:3] == [0, 1, 2] and out[4] == 4
    assert isinstance(out[3], TaskFailure) and "three is bad" in out[3].error


def test_dead_worker_is_retried(ray_local, tmp_path):
    assert parallel_map(die_once, [str(tmp_path / "marker")], progress=False) == ["survived"]
