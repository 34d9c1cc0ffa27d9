"""Running LLM-written reward code safely: a static check, then a sandboxed process.

1. `static_check` parses the code and refuses anything outside an allow-list:
   statements and expressions of plain arithmetic/logic (no import, class,
   with, try, global, lambda-free of dunders), names limited to the function's
   own variables, `math` and a few pure builtins (`abs`, `min`, `max`, ...),
   attribute access only to public `math.*` and to dict reading methods
   (`get`, `items`, `keys`, `values`). It must define ``reward(state)``.
2. `SandboxedReward` runs the code in a separate Python process (``python -I
   -S``, empty environment) whose operating-system limits hold by themselves,
   without the allow-list (the tests switch the static check off and try):
   - a new network namespace (no interface but a down loopback: no socket
     reaches 127.0.0.1 or anything else), through ``unshare(2)``: as root
     ``CLONE_NEWNET``, otherwise together with a new user namespace;
   - ``chroot`` into an empty, read-only directory (allowed to root, and to
     anyone inside their new user namespace): no file outside is reachable and
     nothing can be created inside;
   - started as root: all groups dropped, then uid/gid 65534 (nobody);
   - ``resource.setrlimit``: address space (memory), CPU seconds, file size 0,
     open files 3, processes 0 (no fork: binding once the uid is not root).
   Where the kernel refuses a namespace or chroot (e.g. a container without the
   capability), the worker carries on with what it got and says so
   (`SandboxedReward.isolation`); the static check still stands in front.
   The code's globals hold only `math` and the allowed builtins. Each call is a
   JSON line over a pipe with a wall-clock timeout; a call that runs over is
   killed. A reward outside +-`REWARD_LIMIT` is refused: 1e300 is finite but
   becomes inf in SB3's float32 buffers.

Every failure becomes a `RewardCodeError` with a one-line reason: rejected by
the static check (including code nested too deeply for the parser), syntax
error, timeout, memory limit, crashed, wrong return type, non-finite or
out-of-range value, called after its process was killed. Callers (the
adversary env, the Eureka loop) catch it and carry on.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
from typing import Any

SAFE_BUILTINS = (
    "abs",
    "min",
    "max",
    "sum",
    "len",
    "range",
    "float",
    "int",
    "bool",
    "round",
    "pow",
    "enumerate",
    "zip",
    "sorted",
    "any",
    "all",
    "dict",
    "list",
    "tuple",
    "str",
    "isinstance",
)
DICT_METHODS = {"get", "items", "keys", "values"}
REWARD_LIMIT = 1e6
"""Largest reward magnitude accepted from reward code (beyond it float32 sums overflow within an episode)."""
NOBODY = 65534
ALLOWED_NODES = (
    ast.Module,
    ast.FunctionDef,
    ast.arguments,
    ast.arg,
    ast.Return,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.If,
    ast.IfExp,
    ast.For,
    ast.While,
    ast.Break,
    ast.Continue,
    ast.Pass,
    ast.Expr,
    ast.Compare,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Call,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.Constant,
    ast.Subscript,
    ast.Attribute,
    ast.Dict,
    ast.List,
    ast.Tuple,
    ast.ListComp,
    ast.GeneratorExp,
    ast.comprehension,
    ast.keyword,
    ast.Slice,
    ast.operator,
    ast.boolop,
    ast.cmpop,
    ast.unaryop,
    ast.expr_context,
)


class RewardCodeError(RuntimeError):
    """Reward code refused or failed; ``reason`` is a one-line explanation."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def static_check(code: str, entry: str = "reward") -> None:
    """Refuse code outside the allow-list, or without a top-level ``<entry>(arg)`` (raises `RewardCodeError`)."""
    if len(code) > 20_000:
        raise RewardCodeError(f"rejected: code is {len(code)} characters (limit 20000)")
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        raise RewardCodeError(f"syntax error at line {err.lineno}: {err.msg}") from None
    except (MemoryError, RecursionError) as err:  # e.g. 20k characters of nested unary/binary operators
        raise RewardCodeError(f"rejected: code nested too deeply for the parser ({type(err).__name__})") from None
    bound = {"math", *SAFE_BUILTINS, "True", "False", "None"}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            bound.add(node.name)
            bound.update(a.arg for a in node.args.args + node.args.kwonlyargs)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    for node in ast.walk(tree):  # forbidden statements first, then names: "open" says more than ".write"
        if not isinstance(node, ALLOWED_NODES):
            raise RewardCodeError(
                f"rejected: {type(node).__name__} is not allowed (line {getattr(node, 'lineno', '?')})"
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and (node.id not in bound or node.id.startswith("_")):
            raise RewardCodeError(f"rejected: name '{node.id}' is not allowed (line {node.lineno})")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (node.decorator_list or node.args.vararg or node.args.kwarg):
            raise RewardCodeError(f"rejected: decorators and *args/**kwargs are not allowed (line {node.lineno})")
        if isinstance(node, ast.Attribute):
            on_math = isinstance(node.value, ast.Name) and node.value.id == "math"
            if node.attr.startswith("_") or not (on_math or node.attr in DICT_METHODS):
                raise RewardCodeError(f"rejected: attribute '.{node.attr}' is not allowed (line {node.lineno})")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("__"):
            raise RewardCodeError(f"rejected: dunder string {node.value!r} (line {node.lineno})")
    top = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not top or len(top[0].args.args) != 1:
        arg = "state" if entry == "reward" else "record"
        raise RewardCodeError(f"rejected: the code must define a top-level function {entry}({arg})")


WORKER = r"""
import ctypes, json, math, os, resource, sys
mem, cpu, full, jail = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
nobody, limit, entry = int(sys.argv[6]), float(sys.argv[7]), sys.argv[8]
for name in filter(None, sys.argv[5].split(",")):  # tests only: modules an attacker wants, loaded before isolation
    __import__(name)
root = os.getuid() == 0
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
iso = {"netns": libc.unshare(CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET) == 0}
try:
    os.chroot(jail)
    os.chdir("/")
    iso["chroot"] = True
except OSError:
    os.chdir(jail)
    iso["chroot"] = False
if root:
    os.setgroups([])
    os.setgid(nobody)
    os.setuid(nobody)
iso["uid"] = os.getuid()
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (3, 3))
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
names = json.loads(sys.stdin.readline())
code = sys.stdin.readline()
code = json.loads(code)
import builtins
safe = vars(builtins) if full else {n: getattr(builtins, n) for n in names}
scope = {"__builtins__": safe, "math": math}
try:
    exec(compile(code, "<reward>", "exec"), scope)
    fn = scope[entry]
    send({"ready": True, "isolation": iso})
except MemoryError:
    send({"error": "memory limit exceeded while loading"}); sys.exit(0)
except BaseException as err:
    send({"error": "failed to load: %s: %s" % (type(err).__name__, err)}); sys.exit(0)
for line in sys.stdin:
    try:
        value = fn(json.loads(line))
    except MemoryError:
        send({"error": "memory limit exceeded"}); continue
    except RecursionError:
        send({"error": "recursion too deep"}); continue
    except BaseException as err:
        send({"error": "raised %s: %s" % (type(err).__name__, str(err)[:200])}); continue
    if entry == "recognize":  # an accident-type recognizer: a verdict
        if isinstance(value, bool):
            send({"ok": value})
        else:
            send({"error": "wrong return type: %s (expected bool)" % type(value).__name__})
        continue
    parts = value if isinstance(value, dict) else {"": value}
    bad = [k for k, v in parts.items() if not isinstance(k, str) or type(v) not in (int, float)]
    if bad:
        got = type(parts[bad[0]]).__name__ if isinstance(value, dict) else type(value).__name__
        send({"error": "wrong return type: %s (expected float, or a dict of named floats)" % got}); continue
    odd = [v for v in parts.values() if not math.isfinite(v)]
    if odd:
        send({"error": "non-finite reward %r" % odd[0]}); continue
    big = [v for v in list(parts.values()) + [sum(parts.values())] if abs(v) > limit]
    if big:
        send({"error": "reward %.3g outside [-%g, %g] (refused: it would overflow float32 training buffers)"
              % (big[0], limit, limit)}); continue
    send({"ok": {k: float(v) for k, v in value.items()} if isinstance(value, dict) else float(value)})
"""


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
    ):
        if check:
            static_check(code, self.entry)
        self.code, self.timeout_s = code, timeout_s
        self.calls = 0
        self.closed = False
        self.tmp = tempfile.mkdtemp(prefix="aed-sandbox-")  # the child's empty root (chroot) or cwd
        os.chmod(self.tmp, 0o555)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                WORKER,
                str(memory_mb << 20),
                str(cpu_s),
                "1" if _unsafe_full_builtins else "0",
                self.tmp,
                ",".join(_unsafe_preimport),
                str(NOBODY),
                repr(REWARD_LIMIT),
                self.entry,
            ],
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
        reply = self._receive(max(timeout_s, 5.0), "loading")
        if "error" in reply:
            self.close()
            raise RewardCodeError(reply["error"])
        self.isolation: dict[str, Any] = reply["isolation"]
        """What the OS granted: ``netns`` (own network namespace), ``chroot`` (empty root), ``uid``."""

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
        return reply["ok"]

    def _send(self, obj: Any) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def _receive(self, timeout_s: float, what: str) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.close()
            raise RewardCodeError(f"timed out after {timeout_s:g} s while {what} (process killed)")
        line = self.proc.stdout.readline()
        if not line:
            raise RewardCodeError(self._death(what))
        return json.loads(line)

    def _death(self, what: str) -> str:
        code = self.proc.wait(timeout=5)
        self.close()
        if code == -signal.SIGXCPU or code == -signal.SIGKILL:
            return f"killed by the CPU time limit while {what}"
        return f"sandbox process died while {what} (exit code {code})"

    def close(self) -> None:
        self.closed = True
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(OSError):
            os.rmdir(self.tmp)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self):
        raise TypeError("SandboxedReward holds a process; send its code and build it in the worker")


class SandboxedRecognizer(SandboxedReward):
    """``recognize(record) -> bool`` of an LLM-proposed accident type, sandboxed like a reward."""

    entry = "recognize"


class LazySandboxedReward:
    """A `SandboxedReward` that starts its process on first call (for registering code without running it yet)."""

    def __init__(self, code: str, **kwargs):
        static_check(code)
        self.code, self.kwargs, self._fn = code, kwargs, None

    def __call__(self, state: dict[str, Any]) -> float:
        if self._fn is None:
            self._fn = SandboxedReward(self.code, **self.kwargs)
        return self._fn(state)


def check_reward(code: str, probe_states: list[dict], **kwargs) -> str | None:
    """None if `code` passes the static check and returns floats on `probe_states`; else the reason."""
    try:
        fn = SandboxedReward(code, **kwargs)
    except RewardCodeError as err:
        return err.reason
    try:
        for state in probe_states:
            fn(state)
    except RewardCodeError as err:
        return err.reason
    finally:
        fn.close()
    return None


def is_finite(x: float) -> bool:
    return math.isfinite(x)
