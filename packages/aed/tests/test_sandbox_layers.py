"""Each sandbox layer attacked alone: the upper layers (static check, audit hook) switched off, as root and as an
unprivileged user (``setpriv`` to nobody, with a Python nobody can run), each attack with a control that works.

Layers, bottom up: the parent's own check of every reply; the jail (own read-only tmpfs, chroot, no capabilities);
``close()`` killing the PID namespace's init; no ``ctypes`` after isolation; the audit hook and the calls it
cannot see (``setsid``, raw writes, ``pipe``, ``memfd_create``, the import machinery's copies of C modules).
"""

from __future__ import annotations

import _ctypes
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from palaestra.aed.allowlist import RewardCodeError
from palaestra.aed.sandbox import SandboxedReward, reply_problem, run_once

STATE = {"t": 0.0}
OS_ONLY = {"check": False, "_unsafe_full_builtins": True, "_unsafe_preimport": ("os",), "_unsafe_no_audit": True}
RUNTIME = {"check": False}
NOBODY = 65534
SRC = str(Path(__file__).resolve().parents[1] / "src")


# -- the parent's reply check: whatever the worker prints, only a RewardCodeError comes out ----------------------

FORGE = "import sys\ndef reward(state):\n    sys.stdout.write({line!r})\n    sys.stdout.flush()\n    return 1.0\n"


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"ok": ' + "9" * 400 + "}\n", "an integer of 400 digits"),  # math.isfinite raised OverflowError here
        ('{"ok": -' + "9" * 400 + "}\n", "an integer of 400 digits"),
        ('{"ok": {"a": ' + "9" * 400 + "}}\n", "an integer of 400 digits"),
        ('{"ok": ' + "9" * 5000 + "}\n", "malformed reply"),  # beyond Python's int-from-text limit
        ('{"ok": "1.5"}\n', "wrong return type: str"),
        ('{"ok": "nan"}\n', "wrong return type: str"),
        ('{"ok": 1e999}\n', "non-finite reward inf"),
        ('{"ok": -Infinity}\n', "non-finite reward -inf"),
        ('{"ok": {"a": NaN}}\n', "non-finite reward nan"),
        ('{"ok": {"a": {"b": 1.0}}}\n', "wrong return type: dict"),
        ('{"ok": [1.0]}\n', "wrong return type: list"),
        ('{"ok": null}\n', "wrong return type: NoneType"),
        ('{"ok": ' + "[" * 8000 + "}\n", "malformed reply"),  # json's RecursionError
        ('{"isolation": {}}\n', "malformed reply"),
        ('{"error": {"nested": 1}}\n', "malformed error reply"),
        ("\xff\xfe\n", "malformed reply"),
        ("9" * 100_000, "reply longer than"),
    ],
)
def test_any_forged_line_is_a_reward_code_error(line, reason):
    fn = SandboxedReward(FORGE.format(line=line), **OS_ONLY)
    try:
        with pytest.raises(RewardCodeError) as err:
            fn(STATE)
        assert reason in err.value.reason and "process killed" in err.value.reason, err.value.reason
    finally:
        fn.close()


def test_the_reply_check_raises_nothing_on_random_values():
    """A reference: every accepted reply is a finite float (or named floats) within the limit; a random mix of
    JSON values never makes the check raise."""
    rng = random.Random(0)
    atoms = [0, 1.5, -2, 10**400, -(10**30), 1e308, math.nan, math.inf, "1.0", None, True, [], {}]

    def value(depth: int):
        pick = rng.random()
        if depth > 3 or pick < 0.6:
            return rng.choice(atoms)
        if pick < 0.8:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["a", "b", "x" * 70, ""]): value(depth + 1) for _ in range(rng.randint(0, 3))}

    accepted = 0
    for _ in range(3000):
        reply = rng.choice([{"ok": value(0)}, {"ok": value(0), "x": 1}, value(0)])
        problem = reply_problem(reply, rng.choice(["reward", "recognize"]))  # type: ignore[arg-type]
        assert problem is None or isinstance(problem, str)
        if problem is None and isinstance(reply["ok"], (int, float)) and not isinstance(reply["ok"], bool):
            accepted += 1
            assert math.isfinite(float(reply["ok"])) and abs(reply["ok"]) <= 1e6
    assert accepted > 30  # the control: plain numbers do pass


# -- the jail: an escape by chmod / mkdir / chroot, then the caller's files ------------------------------------

ESCAPE = """
import os
def reward(state):
    os.close(2)  # a free descriptor (three at most)
    got = {}
    def attempt(name, f):
        try:
            f()
            got[name] = 1.0
        except OSError:
            pass
    attempt('chmod', lambda: os.chmod('/', 0o777))
    attempt('mkdir', lambda: os.mkdir('/x'))
    attempt('chroot_in', lambda: os.chroot('/x' if 'mkdir' in got else '/'))
    for _ in range(64):
        attempt('up', lambda: os.chdir('..'))
    attempt('chroot_out', lambda: os.chroot('.'))
    attempt('read', lambda: open(VICTIM).read())
    attempt('truncate', lambda: open(VICTIM, 'w').close())
    attempt('symlink', lambda: os.symlink('/', LINK))
    got.pop('up', None)
    return got
"""


def escape_code(folder: str) -> str:
    victim, link = os.path.join(folder, "victim.ckpt"), os.path.join(folder, "link")
    return ESCAPE.replace("VICTIM", repr(victim)).replace("LINK", repr(link))


@pytest.fixture
def caller_folder():
    """A folder of the caller's with a stand-in victim checkpoint, readable and writable by nobody too."""
    folder = tempfile.mkdtemp(prefix="aed-caller-")
    Path(folder, "victim.ckpt").write_text("weights")
    for path in (folder, os.path.join(folder, "victim.ckpt")):
        os.chown(path, NOBODY, NOBODY)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_jail_holds_without_the_upper_layers(caller_folder):
    got = run_once(escape_code(caller_folder), STATE, **OS_ONLY)
    assert got == {}, got
    assert Path(caller_folder, "victim.ckpt").read_text() == "weights"
    assert sorted(os.listdir(caller_folder)) == ["victim.ckpt"]


DRIVER = """
import json, os, sys, time
from palaestra.aed.allowlist import RewardCodeError
from palaestra.aed.sandbox import SandboxedReward
code, settings, mode = json.loads(sys.argv[1])
settings["_unsafe_preimport"] = tuple(settings.get("_unsafe_preimport", ()))
try:
    fn = SandboxedReward(code, **settings)
except RewardCodeError as err:  # refused while loading
    print(json.dumps({"value": err.reason, "isolation": None}))
    sys.exit(0)
out = {"isolation": fn.isolation}
try:
    out["value"] = fn({"t": 0.0})
except RewardCodeError as err:
    out["value"] = err.reason
if mode == "survivor":
    pid = fn.proc.pid
    out["init"] = int(open(f"/proc/{pid}/task/{pid}/children").read().split()[0])
fn.close()
print(json.dumps(out))
"""


def python_for_nobody() -> str | None:
    """A Python interpreter nobody may run (the venv's may live under /root), or None."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        return None
    spawn = "import subprocess, sys; subprocess.run([sys.executable, '-I', '-c', 'pass'], check=True, env={})"
    for python in ("/usr/bin/python3", sys.executable):  # it must start itself again (the sandbox's worker)
        probe = subprocess.run(as_nobody([python, "-I", "-c", spawn]), capture_output=True, timeout=30, cwd="/")
        if probe.returncode == 0:
            return python
    return None


def as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def run_as_nobody(code: str, settings: dict, mode: str = "outcome") -> dict:
    python = python_for_nobody()
    if python is None:
        pytest.skip("no way to run as an unprivileged user here (not root, no setpriv, or no Python for nobody)")
    argv = as_nobody([python, "-c", DRIVER, json.dumps([code, settings, mode])])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PYTHONPATH": SRC}, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_jail_holds_for_an_unprivileged_caller(caller_folder):
    got = run_as_nobody(escape_code(caller_folder), OS_ONLY)
    iso = got["isolation"]
    assert iso["jail"] and iso["no_caps"] and iso["chroot"] and not iso["own_uid"], iso
    assert got["value"] == {}, got  # no chmod, mkdir, chroot; the checkpoint neither read nor truncated
    assert Path(caller_folder, "victim.ckpt").read_text() == "weights"
    assert sorted(os.listdir(caller_folder)) == ["victim.ckpt"]


def test_the_escape_program_works_outside_the_sandbox(caller_folder):
    """The control: run as nobody without a sandbox, the same program reads, truncates and links."""
    python = python_for_nobody()
    if python is None:
        pytest.skip("no way to run as an unprivileged user here")
    program = escape_code(caller_folder) + "print(sorted(reward({})))\n"
    done = subprocess.run(as_nobody([python, "-I", "-c", program]), capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "['read', 'symlink', 'truncate']", done.stderr
    assert Path(caller_folder, "victim.ckpt").read_text() == ""


# -- close(): no process the reward starts survives it ---------------------------------------------------------

SURVIVOR = """
import ctypes, os, signal, sys
def reward(state):
    os.setsid()  # out of the process group that close() used to kill
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # PDEATHSIG cleared: the relay's death no longer kills it
    sys.stdout.write('{"ok": 1.0}\\n')
    sys.stdout.flush()
    signal.pause()
"""
SURVIVOR_SETTINGS = {**OS_ONLY, "_unsafe_preimport": ("os", "ctypes", "signal")}


def alive(pid: int, timeout_s: float = 3.0) -> bool:
    """Whether `pid` is still running (not gone, not a zombie) after waiting up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


def test_a_setsid_child_dies_with_close():
    fn = SandboxedReward(SURVIVOR, **SURVIVOR_SETTINGS)
    if not fn.isolation["pidns"]:
        fn.close()
        pytest.skip("no PID namespace here")
    assert fn(STATE) == 1.0
    init = int(Path(f"/proc/{fn.proc.pid}/task/{fn.proc.pid}/children").read_text().split()[0])
    fn.close()
    assert not alive(init)


def test_a_setsid_child_survives_a_process_group_kill():
    """The control: close() without killing the namespace's init (the old close) leaves it running."""
    fn = SandboxedReward(SURVIVOR, **SURVIVOR_SETTINGS)
    if not fn.isolation["pidns"]:
        fn.close()
        pytest.skip("no PID namespace here")
    assert fn(STATE) == 1.0
    init = int(Path(f"/proc/{fn.proc.pid}/task/{fn.proc.pid}/children").read_text().split()[0])
    os.close(fn._init)
    fn._init = None
    fn.close()
    try:
        assert alive(init, timeout_s=0.5)
    finally:
        os.kill(init, 9)


def test_a_setsid_child_dies_with_close_for_an_unprivileged_caller():
    got = run_as_nobody(SURVIVOR, SURVIVOR_SETTINGS, mode="survivor")
    assert got["value"] == 1.0 and got["isolation"]["pidns"], got
    assert not alive(got["init"])


# -- no ctypes after isolation (audit hook off, every builtin) --------------------------------------------------

COPY_CTYPES = f"""
def reward(state):
    loader = math.__loader__
    spec = loader.create_module.__globals__['_bootstrap'].ModuleSpec('_ctypes', loader, origin={_ctypes.__file__!r})
    loader.create_module(spec)
    return 1.0
"""
NO_AUDIT = {"check": False, "_unsafe_full_builtins": True, "_unsafe_no_audit": True}


def test_ctypes_cannot_be_imported_once_isolation_is_set_up():
    for name in ("ctypes", "_ctypes"):
        reason = run_once(f"import {name}\ndef reward(state):\n    return 1.0\n", STATE, **NO_AUDIT)
        assert "failed to load: ModuleNotFoundError: import of" in reason, reason
    reason = run_once(COPY_CTYPES, STATE, **NO_AUDIT)  # the import machinery's copy of the loaded C module
    assert "sandbox: '_imp.create_dynamic' is not allowed" in reason, reason
    control = "import ctypes\ndef reward(state):\n    return float(ctypes.CDLL(None).getpid())\n"
    assert run_once(control, STATE, **NO_AUDIT, _unsafe_preimport=("ctypes",)) == 1.0  # PID 1 of its namespace


# -- the audit hook and the calls it cannot see (static check off, restricted builtins) -------------------------

WALK = "math.__loader__.create_module.__globals__"


@pytest.mark.parametrize(
    "call, refusal",
    [
        (f"{WALK}['sys'].modules['posix'].setsid()", "'os.setsid' is not allowed"),
        (f"{WALK}['_os'].write(1, b'{{\"ok\": 1e308}}\\n')", "'os.write' is not allowed"),
        (f"{WALK}['_os'].pipe()", "'os.pipe' is not allowed"),
        (f"{WALK}['_os'].memfd_create('x')", "'os.memfd_create' is not allowed"),
        (f"{WALK}['sys'].stdout.write('x')", "AttributeError"),  # the streams are gone from sys
        (f"{WALK}['_imp'].create_builtin({WALK}['sys'].modules['posix'].__spec__)", "'_imp.create_builtin'"),
        (f"{WALK}['sys'].modules['_io'].FileIO(1, 'w')", "'open' is not allowed"),
    ],
)
def test_the_audit_layer_refuses_what_the_loader_walk_reaches(call, refusal):
    code = f"def reward(state):\n    {call}\n    return 1.0\n"
    reason = run_once(code, STATE, **RUNTIME)
    assert refusal in reason, reason
    if "AttributeError" not in refusal:  # the control: with the layer off the same call goes through
        assert refusal not in str(run_once(code, STATE, **NO_AUDIT, _unsafe_preimport=("ctypes",)))


CFUNC = "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_CData'][0].__subclasses__()"
RAW_CALL = (  # _ctypes's static types outlive ctypes; no audit event covers a call at a raw address
    "def reward(state):\n"
    f"    types = dict([(c.__name__, c) for c in {CFUNC}])\n"
    "    f = ().__class__.__class__('F', (types['CFuncPtr'],), dict([('_flags_', 1)]))\n"
    "    return float(f(4096)())\n"
)


def test_a_call_at_a_raw_address_finds_only_inert_types():
    """Without the audit hook and the static check a new function-pointer type is inert ("abstract class");
    with ctypes kept (the control) the same call crashes the worker, and only the worker."""
    assert run_once(RAW_CALL, STATE, **NO_AUDIT) == "raised TypeError: abstract class"
    assert "killed by SIGSEGV" in run_once(RAW_CALL, STATE, **NO_AUDIT, _unsafe_preimport=("ctypes",))
    assert run_once("def reward(state):\n    return 2.0\n", STATE) == 2.0


def test_no_ctypes_and_the_audit_layer_hold_for_an_unprivileged_caller():
    got = run_as_nobody("import ctypes\ndef reward(state):\n    return 1.0\n", NO_AUDIT)
    assert "ModuleNotFoundError: import of ctypes" in got["value"], got
    got = run_as_nobody(RAW_CALL, NO_AUDIT)
    assert got["value"] == "raised TypeError: abstract class" and got["isolation"]["no_ctypes"], got
    code = f"def reward(state):\n    {WALK}['sys'].modules['posix'].setsid()\n    return 1.0\n"
    got = run_as_nobody(code, RUNTIME)
    assert "'os.setsid' is not allowed" in got["value"] and got["isolation"]["no_caps"], got
