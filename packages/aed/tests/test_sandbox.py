"""Hostile and broken reward code: each is refused or killed with a clear reason, nothing leaks, training goes on."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from palaestra.aed.allowlist import RewardCodeError, static_check
from palaestra.aed.sandbox import SandboxedReward

STATE = {"rel": {"dist": 4.0}, "event": {"victim_collision": 0.0}}
GOOD = "def reward(state):\n    d = state['rel']['dist']\n    return -math.sqrt(d) + max(0.0, 1.0)\n"


def refuse(code: str, **kwargs) -> str:
    with pytest.raises(RewardCodeError) as err:
        fn = SandboxedReward(code, **kwargs)
        try:
            fn(STATE)
        finally:
            fn.close()
    return err.value.reason


def test_good_code_runs_in_sandbox():
    fn = SandboxedReward(GOOD)
    assert fn(STATE) == pytest.approx(-2.0 + 1.0)
    assert fn({"rel": {"dist": 9.0}}) == pytest.approx(-2.0)
    fn.close()


@pytest.mark.parametrize(
    "code, expected",
    [
        ("import os\ndef reward(state):\n    return 1.0\n", "Import is not allowed"),
        ("import subprocess\ndef reward(state):\n    return 1.0\n", "Import is not allowed"),
        ("from os import system\ndef reward(state):\n    return 1.0\n", "ImportFrom is not allowed"),
        ("def reward(state):\n    return __import__('os').system('touch /tmp/x')\n", "name '__import__'"),
        ("def reward(state):\n    open('/tmp/aed_pwned', 'w').write('x')\n    return 1.0\n", "name 'open'"),
        ("def reward(state):\n    return eval('1+1')\n", "name 'eval'"),
        ("def reward(state):\n    return ().__class__.__bases__[0]\n", "attribute '.__"),
        ("def reward(state):\n    return getattr(state, 'x')\n", "name 'getattr'"),
        ("def reward(state):\n    return globals()\n", "name 'globals'"),
        ("def reward(state):\n    with state as s:\n        pass\n    return 1.0\n", "With is not allowed"),
        ("def reward(state)\n    return 1.0\n", "syntax error at line 1"),
        ("def score(state):\n    return 1.0\n", "must define a top-level function reward(state)"),
    ],
)
def test_static_check_refuses(code, expected):
    with pytest.raises(RewardCodeError) as err:
        static_check(code)
    assert expected in err.value.reason


def test_infinite_loop_is_killed():
    start = time.monotonic()
    reason = refuse("def reward(state):\n    while True:\n        pass\n", timeout_s=0.5)
    assert "timed out" in reason and "killed" in reason
    assert time.monotonic() - start < 5


def test_memory_bomb_hits_the_limit():
    reason = refuse("def reward(state):\n    x = [0] * (10 ** 9)\n    return 1.0\n", memory_mb=128)
    assert "memory limit" in reason


@pytest.mark.parametrize(
    "ret, expected",
    [
        ("'high'", "wrong return type: str"),
        ("None", "wrong return type: NoneType"),
        ("True", "wrong return type: bool"),
        ("float('nan')", "non-finite"),
        ("[1.0]", "wrong return type: list"),
    ],
)
def test_wrong_return_types(ret, expected):
    assert expected in refuse(f"def reward(state):\n    return {ret}\n")


def test_exception_is_reported():
    assert "raised ZeroDivisionError" in refuse("def reward(state):\n    return 1 / 0\n")
    assert "raised KeyError" in refuse("def reward(state):\n    return state['nope']\n")


UNCHECKED = {
    "check": False,
    "_unsafe_full_builtins": True,
    "_unsafe_preimport": ("os", "socket", "encodings.idna"),
    "_unsafe_no_audit": True,
}
"""No allow-list, every builtin, no audit hook, and the modules an attacker wants already imported: only the OS
layer is left."""


def isolation() -> dict:
    fn = SandboxedReward(GOOD)
    try:
        return fn.isolation
    finally:
        fn.close()


def test_isolation_drops_root_and_takes_namespaces():
    iso = isolation()
    assert iso["audit"] is True
    if os.getuid() == 0:  # a uid of its own: neither root nor the nobody that every sandbox used to share
        assert iso["own_uid"] and iso["uid"] > 200_000 and iso["chroot"]
        assert isolation()["uid"] != iso["uid"]
    if not (iso["netns"] and iso["pidns"]):
        pytest.skip("this kernel refuses network or PID namespaces here")
    assert iso["netns"] and iso["pidns"]


def test_mkdir_fails_without_the_static_check(tmp_path):
    outside = tmp_path / "made_by_reward"
    code = f"import os\ndef reward(state):\n    os.mkdir({str(outside)!r})\n    return 1.0\n"
    assert "raised FileNotFoundError" in refuse(code, **UNCHECKED)  # the chroot: no path outside exists
    code = "import os\ndef reward(state):\n    os.mkdir('here')\n    return 1.0\n"
    reason = refuse(code, **UNCHECKED)  # the empty root is a read-only tmpfs (or, without one, a 0555 folder)
    assert "Read-only file system" in reason or "raised PermissionError" in reason, reason
    assert not outside.exists()


def test_file_creation_after_closing_a_descriptor_fails(tmp_path):
    target = tmp_path / "leak.txt"
    for path in (str(target), "leak.txt", "/tmp/aed_leak.txt"):
        code = f"import os\ndef reward(state):\n    os.close(2)\n    open({path!r}, 'w').write('x')\n    return 1.0\n"
        reason = refuse(code, **UNCHECKED)
        assert any(f"raised {e}" in reason for e in ("FileNotFoundError", "PermissionError", "OSError")), reason
        assert "Read-only" in reason or "Errno 30" not in reason
    assert not target.exists()


def test_socket_to_localhost_fails_after_closing_a_descriptor():
    if not isolation()["netns"]:
        pytest.skip("this kernel refuses network namespaces here: the allow-list is the barrier")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(2)
    port = listener.getsockname()[1]
    got = []
    waiter = threading.Thread(target=lambda: got.append(_accept(listener)), daemon=True)
    waiter.start()
    code = (
        "import os, socket\ndef reward(state):\n    os.close(2)\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    return 1.0\n"
    )
    reason = refuse(code, **UNCHECKED)
    assert "Network is unreachable" in reason, reason
    waiter.join(5)
    assert got == [None]  # nobody connected
    listener.close()


def test_fork_fails_without_the_static_check():
    code = "import os\ndef reward(state):\n    if os.fork() == 0:\n        os._exit(0)\n    return 1.0\n"
    reason = refuse(code, **UNCHECKED)
    assert "raised BlockingIOError" in reason, reason  # EAGAIN: RLIMIT_NPROC 0 binds for uid 65534


def _accept(listener):
    try:
        conn, _ = listener.accept()
        conn.close()
        return "connected"
    except OSError:
        return None


@pytest.mark.parametrize("nest", ["-" * 19_900 + "1", "1+" * 9_950 + "1", "not " * 4_970 + "1"])
def test_deeply_nested_code_is_a_reward_code_error(nest):
    code = f"def reward(state):\n    return {nest}\n"
    assert len(code) > 19_000
    with pytest.raises(RewardCodeError, match="nested too deeply"):
        static_check(code)
    # the same code without the static check fails to compile in the child: still a RewardCodeError
    assert "failed to load" in refuse(code, check=False) or "memory" in refuse(code, check=False)


@pytest.mark.parametrize("value", ["1e300", "-1e300", "2e6"])
def test_huge_finite_rewards_are_refused(value):
    assert float(value) < float("inf")
    assert "outside [-1e+06, 1e+06]" in refuse(f"def reward(state):\n    return {value}\n")


def test_calling_a_killed_reward_is_a_reward_code_error():
    fn = SandboxedReward("def reward(state):\n    while True:\n        pass\n", timeout_s=0.3)
    with pytest.raises(RewardCodeError, match="timed out"):
        fn(STATE)
    with pytest.raises(RewardCodeError, match="after its sandbox process was killed"):
        fn(STATE)
    fn = SandboxedReward(GOOD)
    os.kill(fn.proc.pid, 9)
    fn.proc.wait(5)
    with pytest.raises(RewardCodeError, match="died|killed"):
        fn(STATE)


def test_training_goes_on_when_the_reward_is_killed():
    from palaestra.aed.env import AdversaryEnv

    slow = "def reward(state):\n    n = 0\n    while state['t'] >= 0:\n        n = n + 1\n    return 0.0\n"
    env = AdversaryEnv(
        "highway",
        "rear_end",
        reward_fn=SandboxedReward(slow, timeout_s=0.3),
        overrides={"vehicles_count": 6},
        max_steps=4,
    )
    env.reset(seed=0)
    rewards, infos = [], []
    for _ in range(4):
        _, r, term, trunc, info = env.step(1)
        rewards.append(r)
        infos.append(info)
        if term or trunc:
            break
    assert "timed out" in infos[0]["reward_error"]
    assert env.reward_fn is env.expert  # fell back to the expert reward and kept stepping
    assert len(rewards) >= 2


def test_named_components_come_back_and_bad_ones_are_refused():
    fn = SandboxedReward("def reward(state):\n    return {'near': -state['rel']['dist'], 'bonus': 2}\n")
    assert fn(STATE) == {"near": -4.0, "bonus": 2.0}
    fn.close()
    assert "wrong return type: str" in refuse("def reward(state):\n    return {'a': 'x'}\n")
    assert "outside" in refuse("def reward(state):\n    return {'a': 9e5, 'b': 9e5}\n")  # the sum is too large
