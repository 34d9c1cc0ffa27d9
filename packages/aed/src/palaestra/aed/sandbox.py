"""Running LLM-written reward code safely: a static check, then a sandboxed process, then checked replies.

1. `palaestra.aed.allowlist.static_check` refuses anything outside the
   allow-list (no rebinding of ``math`` or the builtins, no frame, dunder or
   format attributes; see that module).
2. `SandboxedReward` runs the code in a child process
   (`palaestra.aed.sandbox_worker`, ``python -I -S``, empty environment)
   whose layers hold without the allow-list (the tests switch it off and
   try): its own network, PID and mount namespaces, chroot into an empty
   read-only tmpfs of its own (no file of the caller's), a uid of its own
   when started as root, no capabilities left (also in the user namespace
   of the non-root path), rlimits (memory, CPU, no files, no fork), no
   ``ctypes`` once isolated (its classes collected, new ones inert), an audit hook refusing every audited event once
   the code runs (imports, files, sockets, signals, frames) plus the calls
   no event covers (``setsid``, raw writes, ``pipe``, ``memfd_create``), and
   a caller whose globals hold nothing. `close` kills the PID namespace's
   init, and with it every process the code started. What the kernel granted is
   `SandboxedReward.isolation`; a missing layer is logged and warned about
   (`missing_layers`), and jobs log it on every run (`probe_isolation`).
3. The parent trusts no reply: each is parsed with a length limit and checked
   again, raising nothing but `RewardCodeError` whatever the line holds
   (type; finite; within +-`REWARD_LIMIT`, since 1e300 becomes inf in
   SB3's float32 buffers; at most `MAX_COMPONENTS` component names of at most
   `MAX_NAME` characters). A malformed reply kills the process.

Every failure becomes a `RewardCodeError` with a one-line reason: rejected by
the static check (including code nested too deeply for the parser), syntax
error, timeout, memory limit, killed (by its CPU limit, or by which signal),
wrong return type, non-finite or out-of-range value, malformed reply, called
after its process was killed. Callers (the adversary env, the Eureka loop)
catch it and carry on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from palaestra.aed.allowlist import SAFE_BUILTINS, RewardCodeError, static_check

REWARD_LIMIT = 1e6
"""Largest reward magnitude accepted from reward code (beyond it float32 sums overflow within an episode)."""
MAX_COMPONENTS, MAX_NAME = 32, 64
"""At most this many named reward components, each name at most this many characters."""
MAX_REPLY = 8192
"""Longest reply line (bytes) the parent reads from a sandbox."""
UID_BASE = 200_000
"""Started as root, a sandbox runs as uid ``UID_BASE + its pid``: no two share a uid, none is the caller's."""
LAYERS = ("netns", "pidns", "chroot", "jail", "no_caps", "no_ctypes", "audit")
"""Isolation layers every sandbox should get (plus ``own_uid`` when started as root)."""
WORKER = str(Path(__file__).with_name("sandbox_worker.py"))
log = logging.getLogger(__name__)
_warned: set[tuple[str, ...]] = set()


def missing_layers(isolation: dict[str, Any]) -> list[str]:
    """The isolation layers a sandbox did not get (`LAYERS`, and ``own_uid`` where the caller is root)."""
    missing = [k for k in LAYERS if not isolation.get(k)]
    if os.getuid() == 0 and not isolation.get("own_uid"):
        missing.append("own_uid")
    return missing


def report_isolation(isolation: dict[str, Any], where: str = "sandbox") -> list[str]:
    """Log what a sandbox got; warn (once per process and set of gaps) when a layer is missing."""
    missing = missing_layers(isolation)
    log.info("%s isolation: %s", where, isolation)
    if missing and tuple(missing) not in _warned:
        _warned.add(tuple(missing))
        text = (
            f"aed {where}: isolation layers MISSING here: {', '.join(missing)} (got {isolation}); the static check "
            "and the remaining layers stand in front of LLM-written code (the kernel or container refused them)"
        )
        log.warning(text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)
    return missing


class SandboxedReward:
    """``reward(state)`` of checked code, evaluated in a resource-limited child process."""

    entry = "reward"

    def __init__(
        self,
        code: str,
        timeout_s: float = 1.0,
        memory_mb: int = 256,
        cpu_s: int = 120,
        check: bool = True,
        _unsafe_full_builtins: bool = False,
        _unsafe_preimport: tuple[str, ...] = (),
        _unsafe_no_audit: bool = False,
    ):
        if check:
            static_check(code, self.entry)
        self.code, self.timeout_s, self.cpu_s = code, timeout_s, cpu_s
        self.calls = 0
        self.closed = False
        self._buffer = b""
        self.tmp = tempfile.mkdtemp(prefix="aed-sandbox-")  # the child's empty root (chroot) or cwd
        os.chmod(self.tmp, 0o555)
        argv = [str(memory_mb << 20), str(cpu_s), "1" if _unsafe_full_builtins else "0", self.tmp]
        argv += [",".join(_unsafe_preimport), str(UID_BASE), repr(REWARD_LIMIT), self.entry]
        argv += ["0" if _unsafe_no_audit else "1"]
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", WORKER, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self.tmp,
            env={},
            text=True,
            start_new_session=True,
        )
        self._send(list(SAFE_BUILTINS))
        self._send(code)
        first = self._receive(max(timeout_s, 5.0), "loading")
        if "error" in first:
            self.close()
            raise RewardCodeError(first["error"])
        iso = first.get("isolation")
        if not isinstance(iso, dict) or set(iso) != {*LAYERS, "uid", "own_uid"} or not well_typed(iso):
            self.close()
            raise RewardCodeError("malformed isolation report from the sandbox (process killed)")
        self.isolation: dict[str, Any] = iso
        """What the sandbox got: ``netns``, ``pidns`` (own network and PID namespaces), ``chroot`` (empty root),
        ``uid`` and ``own_uid`` (a uid of its own), ``no_ctypes`` (ctypes gone, its types inert), ``audit``
        (the audit hook); sent before the code ran."""
        report_isolation(iso)
        self._init = namespace_init(self.proc.pid) if iso["pidns"] else None
        ready = self._receive(max(timeout_s, 5.0), "loading")
        if ready != {"ready": True}:
            self.close()
            raise RewardCodeError(ready.get("error") or "malformed reply while loading (process killed)")

    def __call__(self, state: dict[str, Any]) -> float | dict[str, float]:
        """The reward (a float, or the code's dict of named components)."""
        self.calls += 1
        if self.closed:
            raise RewardCodeError("called after its sandbox process was killed")
        try:
            self._send(state)
        except (OSError, ValueError):  # broken pipe, or a closed stream
            raise RewardCodeError(self._death("calling")) from None
        reply = self._receive(self.timeout_s, "calling")
        if "error" in reply:
            raise RewardCodeError(reply["error"])
        return self._value(reply)

    def _value(self, reply: dict) -> Any:
        """The checked value of an ``ok`` reply; anything else kills the process (the stream cannot be trusted)."""
        reason = reply_problem(reply, self.entry)
        if reason is not None:
            self.close()
            raise RewardCodeError(f"{reason} (process killed)")
        value = reply["ok"]
        if isinstance(value, dict):
            return {k: float(v) for k, v in value.items()}
        return value if isinstance(value, bool) else float(value)

    def _send(self, obj: Any) -> None:
        assert self.proc.stdin is not None  # opened with PIPE
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _receive(self, timeout_s: float, what: str) -> dict:
        line = self._read_line(timeout_s, what)
        if line is None:
            raise RewardCodeError(self._death(what))
        try:
            reply = json.loads(line)
        except Exception:  # not JSON, nested too deeply (RecursionError), an integer of 5000 digits, ...
            reply = None
        if not isinstance(reply, dict) or len(reply) != 1:
            self.close()
            raise RewardCodeError(f"malformed reply from the sandbox while {what} (process killed)")
        if "error" in reply and not isinstance(reply["error"], str):
            self.close()
            raise RewardCodeError(f"malformed error reply from the sandbox while {what} (process killed)")
        if "error" in reply:
            reply["error"] = reply["error"][:300]
        return reply

    def _read_line(self, timeout_s: float, what: str) -> bytes | None:
        """One reply line (None at end of stream); raw reads with our own buffer, at most `MAX_REPLY` bytes."""
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None  # opened with PIPE
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REPLY:
                self.close()
                raise RewardCodeError(f"reply longer than {MAX_REPLY} bytes while {what} (process killed)")
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.close()
                raise RewardCodeError(f"timed out after {timeout_s:g} s while {what} (process killed)")
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > MAX_REPLY:
            self.close()
            raise RewardCodeError(f"reply longer than {MAX_REPLY} bytes while {what} (process killed)")
        return line

    def _death(self, what: str) -> str:
        code, cpu = self._reap()
        self.close()
        if code >= 0:
            return f"sandbox process exited (exit code {code}) while {what}"
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        if code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu >= self.cpu_s - 0.5):
            return f"killed by its CPU time limit ({self.cpu_s} s, {name}) while {what}"
        return f"killed by {name} after {cpu:.1f} CPU-seconds (not one of its own limits) while {what}"

    def _reap(self, timeout_s: float = 5.0) -> tuple[int, float]:
        """Exit code (negative: the signal) and CPU seconds of the finished child (killed after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped
                return self.proc.returncode if self.proc.returncode is not None else 0, 0.0
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode, usage.ru_utime + usage.ru_stime
            if time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                timeout_s, deadline = 0.0, time.monotonic() + 5.0
            time.sleep(0.01)

    def close(self) -> None:
        """Kill the sandbox: its PID namespace's init first (the kernel then kills every process in it, even one
        that left the process group with ``setsid()``), then the process group of the relaying caller."""
        self.closed = True
        init, self._init = getattr(self, "_init", None), None
        if init is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(init, signal.SIGKILL)
            os.close(init)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, AttributeError):  # AttributeError: no stream
                stream.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.rmdir(self.tmp)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self):
        raise TypeError("SandboxedReward holds a process; send its code and build it in the worker")


def reply_problem(reply: dict, entry: str) -> str | None:
    """Why a sandbox's ``ok`` reply is unacceptable (None if it is fine): the parent's own check of every value.

    It raises nothing, whatever the reply holds (a 400-digit integer, nested objects, NaN)."""
    try:
        return _value_problem(reply, entry)
    except Exception as err:  # a check of our own that failed on odd input: still the sandbox's own error
        return f"malformed reply from the sandbox ({type(err).__name__})"


def _value_problem(reply: dict, entry: str) -> str | None:
    if not isinstance(reply, dict) or set(reply) != {"ok"}:
        return "malformed reply from the sandbox"
    value = reply["ok"]
    if entry == "recognize":
        return None if isinstance(value, bool) else f"wrong return type: {type(value).__name__} (expected bool)"
    parts = value if isinstance(value, dict) else {"": value}
    if len(parts) > MAX_COMPONENTS:
        return f"{len(parts)} reward components (at most {MAX_COMPONENTS})"
    values = []
    for key, v in parts.items():
        if not isinstance(key, str) or len(key) > MAX_NAME:
            return f"component names must be strings of at most {MAX_NAME} characters"
        if type(v) not in (int, float):  # not bool, nor a subclass with methods of its own
            return f"wrong return type: {type(v).__name__} (expected float, or a dict of named floats)"
        if isinstance(v, int) and abs(v) > REWARD_LIMIT:  # before float(), which overflows past 1e308
            return f"reward outside [-{REWARD_LIMIT:g}, {REWARD_LIMIT:g}] (an integer of {len(str(abs(v)))} digits)"
        values.append(float(v))
    if not all(math.isfinite(v) for v in values):
        return f"non-finite reward {next(v for v in values if not math.isfinite(v))!r}"
    if any(abs(v) > REWARD_LIMIT for v in [*values, sum(values)]):
        return f"reward outside [-{REWARD_LIMIT:g}, {REWARD_LIMIT:g}]"
    return None


class SandboxedRecognizer(SandboxedReward):
    """``recognize(record) -> bool`` of an LLM-proposed accident type, sandboxed like a reward."""

    entry = "recognize"


class LazySandboxedReward:
    """A `SandboxedReward` that starts its process on first call (for registering code without running it yet)."""

    def __init__(self, code: str, **kwargs):
        static_check(code)
        self.code, self.kwargs = code, kwargs
        self._fn: SandboxedReward | None = None

    def __call__(self, state: dict[str, Any]) -> float | dict[str, float]:
        if self._fn is None:
            self._fn = SandboxedReward(self.code, **self.kwargs)
        return self._fn(state)


def well_typed(iso: dict[str, Any]) -> bool:
    """An isolation report of booleans and an integer uid (so that logging and checking it cannot fail)."""
    return all(type(v) is bool for k, v in iso.items() if k != "uid") and type(iso["uid"]) is int


def namespace_init(pid: int) -> int | None:
    """A pidfd of the only child of `pid` (the PID namespace's init), taken before the reward code has run."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return os.pidfd_open(int(children[0])) if len(children) == 1 else None
    except (OSError, ValueError):
        return None


def run_on(code: str, states: list[dict], **kwargs) -> list[Any] | str:
    """`code`'s values on `states` in one sandbox, or the reason (``RewardCodeError``) of the first failure."""
    try:
        fn = SandboxedReward(code, **kwargs)
    except RewardCodeError as err:
        return err.reason
    try:
        return [fn(state) for state in states]
    except RewardCodeError as err:
        return err.reason
    finally:
        fn.close()


def run_once(code: str, state: dict, **kwargs) -> Any:
    """`code`'s value on `state` in a sandbox of its own, or the reason (a str) it failed."""
    got = run_on(code, [state], **kwargs)
    return got if isinstance(got, str) else got[0]


def check_reward(code: str, probe_states: list[dict], **kwargs) -> str | None:
    """None if `code` passes the static check and returns floats on `probe_states`; else the reason."""
    got = run_on(code, probe_states, **kwargs)
    return got if isinstance(got, str) else None


def probe_isolation() -> dict[str, Any]:
    """The isolation a sandbox gets on this machine (jobs log it on every run; see `report_isolation`)."""
    fn = SandboxedReward("def reward(state):\n    return 0.0\n")
    try:
        return dict(fn.isolation)
    finally:
        fn.close()
