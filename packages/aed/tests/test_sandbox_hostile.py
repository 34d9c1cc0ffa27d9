"""Programs written to escape the sandbox: each is contained with the static check on, and with it off.

With the check off, what holds is the runtime: restricted builtins and the audit hook in the child
(``RUNTIME``); with the audit hook off and every builtin (``OS_ONLY``), the OS layers, the clean caller
frames and the parent's own check of every reply hold alone.
"""

from __future__ import annotations

import math
import os
import signal
import time

import pytest

from palaestra.aed.allowlist import RewardCodeError, static_check
from palaestra.aed.sandbox import MAX_NAME, SandboxedReward, reply_problem, run_once

STATE = {"rel": {"dist": 4.0}, "t": 0.0}
CHECKED: dict = {}
RUNTIME = {"check": False}
OS_ONLY = {"check": False, "_unsafe_full_builtins": True, "_unsafe_preimport": ("os",), "_unsafe_no_audit": True}


# the issue's program: `math` rebound to a generator whose frame leads to the caller's frames and their globals
FRAME_WALK_ASSIGN = """
def reward(state):
    math = None
    inner = (math.gi_frame for x in [0])
    walk = (math.f_back for math in inner)
    math = walk
    math = list(math)[0]
    found = 0.0
    while math:
        names = math.f_globals
        found = found + len([k for k in ['os', 'sys', 'ctypes', 'libc', 'resource'] if k in names])
        math = math.f_back
    return found
"""
FRAME_WALK_COMPREHENSION = """
def reward(state):
    box = [None]
    box[0] = (box[0] for x in [0])
    frames = [math.gi_frame for math in box]
    return float(len(frames))
"""
FORMAT_FIELD = """
def reward(state):
    math = '{0.__class__.__mro__}'
    return float(len(math.format(state)))
"""
FORMAT_FRAME = """
def reward(state):
    box = [None]
    box[0] = ('{0.gi_frame.f_back.f_back.f_globals}'.format(box[0]) for x in [0])
    text = list(box[0])[0]
    return float('ctypes' in text or "module 'os'" in text)
"""


@pytest.mark.parametrize(
    "code, refusal",
    [
        (FRAME_WALK_ASSIGN, "'math' cannot be rebound"),
        (FRAME_WALK_COMPREHENSION, "'math' cannot be rebound"),
        (FORMAT_FIELD, "'math' cannot be rebound"),
        (FORMAT_FRAME, "attribute '.format'"),
        ("def reward(state):\n    return '{0.gi_frame}'.format(state)\n", "attribute '.format'"),
        ("def reward(state):\n    return 'a'.format_map(state)\n", "attribute '.format_map'"),
        ("def reward(state):\n    return state.get('x').gi_frame\n", "attribute '.gi_frame'"),
        ("def reward(state):\n    return state.tb_frame\n", "attribute '.tb_frame'"),
        ("def reward(state):\n    return state.cr_frame\n", "attribute '.cr_frame'"),
        ("def reward(state):\n    return state.f_back\n", "attribute '.f_back'"),
        ("def reward(state):\n    return state.__class__\n", "attribute '.__class__'"),
        ("def reward(state):\n    return math.__loader__\n", "attribute '.__loader__'"),
        ("def reward(math):\n    return 1.0\n", "'math' cannot be rebound"),
        ("def reward(state):\n    for abs in [1]:\n        pass\n    return 1.0\n", "'abs' cannot be rebound"),
        ("def reward(state):\n    min = max\n    return 1.0\n", "'min' cannot be rebound"),
        ("def reward(state):\n    return [1 for len in [1]][0]\n", "'len' cannot be rebound"),
        ("def math(x):\n    return 1\ndef reward(state):\n    return 1.0\n", "'math' cannot be rebound"),
        ("def reward(state):\n    def f(*, sum=1):\n        return sum\n    return f()\n", "'sum' cannot be rebound"),
        ("def reward(state):\n    if (math := 1):\n        pass\n    return 1.0\n", "NamedExpr is not allowed"),
        ("def reward(state):\n    global math\n    return 1.0\n", "Global is not allowed"),
        ("import math as m\ndef reward(state):\n    return 1.0\n", "Import is not allowed"),
        ("def reward(state):\n    return f'{state}'\n", "JoinedStr is not allowed"),
        ("def reward(state):\n    return state['a__b']\n", "string holding '__'"),
    ],
)
def test_static_check_refuses_escapes(code, refusal):
    with pytest.raises(RewardCodeError) as err:
        static_check(code)
    assert refusal in err.value.reason


def test_static_check_allows_string_methods_and_plain_names():
    static_check("def reward(state):\n    lane = state['adv']['lane']\n    return float(lane.startswith('a'))\n")


@pytest.mark.parametrize("code", [FRAME_WALK_ASSIGN, FRAME_WALK_COMPREHENSION, FORMAT_FRAME])
def test_frame_walks_are_refused_at_run_time_without_the_static_check(code):
    assert "cannot be rebound" in run_once(code, STATE, **CHECKED) or "'.format'" in run_once(code, STATE, **CHECKED)
    reason = run_once(code, STATE, **RUNTIME)
    assert "raised PermissionError: sandbox: 'object.__getattr__' is not allowed" in reason, reason


def test_frames_below_the_reward_hold_no_module_globals():
    """With the audit hook off too, the walk reaches the caller frames: their globals hold no os/sys/ctypes (the
    old worker called the reward from its module, whose globals held all of them)."""
    assert run_once(FRAME_WALK_ASSIGN, STATE, **OS_ONLY) == 0.0
    chain = "def reward(state):\n    math = (x for x in [0])\n    return 1.0\n"
    assert run_once(chain, STATE, **OS_ONLY) == 1.0  # the program itself runs there


def test_format_string_fields_without_the_static_check():
    """A format string reads attributes and items but calls nothing: without the static check it yields a repr
    (here its length), frame attributes inside it are refused by the audit hook (FORMAT_FRAME, above), and with
    the hook off too the frames it reaches hold no module globals."""
    value = run_once(FORMAT_FIELD, STATE, **RUNTIME)
    assert isinstance(value, float) and value == float(len(str(dict.__mro__)))
    assert run_once(FORMAT_FRAME, STATE, **OS_ONLY) == 0.0


def forger(payload: str, how: str) -> str:
    """Reward code writing a forged reply line to the parent before returning 1.0 (static check off)."""
    if how == "sys":  # the OS-only setting: every builtin, no audit hook
        write = f"    import sys\n    sys.stdout.write({payload!r})\n    sys.stdout.flush()\n"
    else:  # restricted builtins, audit hook on: os.write reached through object's subclasses (not audited)
        write = (
            "    wrap = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]\n"
            f"    wrap.__init__.__globals__['write'](1, {payload!r}.encode())\n"
        )
    return f"def reward(state):\n{write}    return 1.0\n"


@pytest.mark.parametrize(
    "payload, reason",
    [
        ('{"ok": 1e308}\n', "outside [-1e+06, 1e+06]"),
        ('{"ok": NaN}\n', "non-finite reward nan"),
        ('{"ok": Infinity}\n', "non-finite reward inf"),
        ('{"ok": {"a": "x"}}\n', "wrong return type: str"),
        ('{"ok": true}\n', "wrong return type: bool"),
        ('{"ok": {"' + "n" * 100 + '": 1.0}}\n', f"at most {MAX_NAME} characters"),
        ('{"ok": 1.0, "extra": 2}\n', "malformed reply"),
        ("not json\n", "malformed reply"),
        ('{"error": 5}\n', "malformed error reply"),
        ("x" * 20_000, "reply longer than"),
    ],
)
def test_forged_replies_are_refused_by_the_parent(payload, reason):
    code = forger(payload, "sys")
    with pytest.raises(RewardCodeError):
        static_check(code)
    fn = SandboxedReward(code, **OS_ONLY)
    try:
        with pytest.raises(RewardCodeError) as err:
            fn(STATE)
        assert reason in err.value.reason and "process killed" in err.value.reason, err.value.reason
        with pytest.raises(RewardCodeError, match="after its sandbox process was killed"):
            fn(STATE)
    finally:
        fn.close()


def test_raw_writes_to_the_parent_are_refused_at_run_time():
    """With the static check off, os.write reached through object's subclasses is refused (no audit event covers
    it: the worker replaces it before the code runs), so no forged line reaches the parent."""
    reason = run_once(forger('{"ok": 1e308}\n', "subclasses"), STATE, **RUNTIME)
    assert "raised PermissionError: sandbox: 'os.write' is not allowed" in reason, reason


def test_reply_check_is_the_parents_own():
    assert reply_problem({"ok": 2.0}, "reward") is None
    assert reply_problem({"ok": {"a": 9e5, "b": 9e5}}, "reward").startswith("reward outside")
    assert "33 reward components" in reply_problem({"ok": {str(i): 0.0 for i in range(33)}}, "reward")
    assert "expected bool" in reply_problem({"ok": 1}, "recognize")


@pytest.mark.parametrize("settings", [CHECKED, RUNTIME, OS_ONLY], ids=["checked", "runtime", "os_only"])
def test_huge_integers_and_many_components_are_reward_code_errors(settings):
    assert "integer too large for a float" in run_once("def reward(state):\n    return 10 ** 400\n", STATE, **settings)
    assert "outside" in run_once("def reward(state):\n    return -(10 ** 7)\n", STATE, **settings)
    many = "def reward(state):\n    return dict([(str(i), 0.0) for i in range(40)])\n"
    assert "40 reward components (at most 32)" in run_once(many, STATE, **settings)
    long_name = "def reward(state):\n    return dict([('n' * 100000, 1.0)])\n"
    assert f"at most {MAX_NAME} characters" in run_once(long_name, STATE, **settings)


def killer(target: str, how: str = "import") -> str:
    if how == "import":
        return f"import os\ndef reward(state):\n    os.kill({target}, 9)\n    return 1.0\n"
    return (  # no import: os.kill reached through object's subclasses
        "def reward(state):\n"
        "    wrap = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]\n"
        f"    wrap.__init__.__globals__['kill']({target}, 9)\n    return 1.0\n"
    )


@pytest.mark.parametrize("target", ["other", "caller", "everyone"])
def test_a_reward_cannot_kill_another_sandbox_or_its_caller(target):
    other = SandboxedReward("def reward(state):\n    return 2.0\n")
    os_layer = other.isolation["pidns"] or other.isolation["own_uid"]
    pid = {"other": other.proc.pid, "caller": os.getpid(), "everyone": -1}[target]
    code = killer(str(pid))
    assert "Import is not allowed" in run_once(code, STATE, **CHECKED)
    assert "ImportError: __import__ not found" in run_once(code, STATE, **RUNTIME)  # restricted builtins
    reason = run_once(killer(str(pid), "subclasses"), STATE, **RUNTIME)
    assert "raised PermissionError: sandbox: 'os.kill' is not allowed" in reason, reason  # the audit hook
    if os_layer:  # only the OS: the PID namespace (or a uid of its own) holds
        reason = run_once(code, STATE, **OS_ONLY)
        if target != "everyone":
            assert "raised ProcessLookupError" in reason or "raised PermissionError" in reason, reason
    assert other(STATE) == 2.0  # the other sandbox lives on (and so does this test process)
    other.close()
    if not os_layer:
        pytest.skip("neither a PID namespace nor a uid of its own here: the OS-only kill would reach this test")


def test_signals_are_reported_truthfully():
    fn = SandboxedReward("def reward(state):\n    return 1.0\n")
    os.kill(fn.proc.pid, signal.SIGKILL)  # killed from outside, not by one of its limits
    time.sleep(0.2)
    with pytest.raises(RewardCodeError) as err:
        fn(STATE)
    assert "killed by SIGKILL" in err.value.reason and "not one of its own limits" in err.value.reason
    assert "CPU time limit" not in err.value.reason
    spin = "def reward(state):\n    while True:\n        pass\n"
    reason = run_once(spin, STATE, cpu_s=1, timeout_s=10)
    assert "killed by its CPU time limit (1 s, SIG" in reason, reason  # SIGKILL at the hard limit as PID 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"a": "x"}, {"a": float("nan")}, "high", 10**400, None])
def test_adversary_env_step_never_returns_nan_or_raises(bad):
    """A reward function's value is converted inside the env's fallback: nan or a string used to come out of
    env.step (nan as the reward, a ValueError raised), ending the training task."""
    from palaestra.aed.env import AdversaryEnv

    env = AdversaryEnv("highway", "rear_end", reward_fn=lambda state: bad, overrides={"vehicles_count": 6})
    env.reset(seed=0)
    _, reward, *_, info = env.step(1)
    assert math.isfinite(reward) and "RewardError" in info["reward_error"]
    assert env.reward_fn is env.expert  # the expert reward from now on
    env.close()


def test_adversary_env_survives_a_forged_sandbox_reply():
    from palaestra.aed.env import AdversaryEnv

    forged = SandboxedReward(forger('{"ok": NaN}\n', "sys"), **OS_ONLY)
    env = AdversaryEnv("highway", "rear_end", reward_fn=forged, overrides={"vehicles_count": 6})
    env.reset(seed=0)
    _, reward, *_, info = env.step(1)
    assert math.isfinite(reward) and "non-finite reward nan" in info["reward_error"]
    env.close()


def test_missing_isolation_layers_are_logged_and_warned(caplog):
    from palaestra.aed import sandbox

    caplog.set_level("INFO", logger="palaestra.aed.sandbox")
    full = {
        "netns": True,
        "pidns": True,
        "chroot": True,
        "jail": True,
        "no_caps": True,
        "no_ctypes": True,
        "audit": True,
    }
    full |= {"uid": 200_123, "own_uid": True}
    assert sandbox.report_isolation(full, "test") == []
    assert "test isolation: {'netns': True" in caplog.text
    gaps = {**full, "pidns": False, "netns": False}
    with pytest.warns(RuntimeWarning, match="isolation layers MISSING here: netns, pidns"):
        assert sandbox.report_isolation(gaps, "test") == ["netns", "pidns"]
    assert "MISSING" in caplog.text
