"""The sandbox's child process: run as a script by `palaestra.aed.sandbox.SandboxedReward`, never imported.

``python -I -S sandbox_worker.py MEM CPU FULL JAIL PREIMPORT UID_BASE LIMIT ENTRY AUDIT``. In order:

1. Namespaces (``unshare(2)``; started as non-root, together with a new user
   namespace): a network namespace (no interface but a down loopback) and a
   PID namespace. A PID namespace holds the children of the caller, not the
   caller, so the worker forks: the child is PID 1 of a namespace where no
   other process exists (it can signal nothing outside), the parent waits and
   leaves with the child's exit status or signal.
2. A mount namespace too: an empty read-only tmpfs over the jail folder, so
   no file in the jail is the caller's (the non-root path runs as the
   caller's uid and could chmod the caller's folder). ``chroot`` into it;
   started as root, all groups dropped and a uid of its own (``UID_BASE +
   pid``: no two sandboxes share one). Then every capability goes (bounding,
   ambient, effective, permitted; no new privileges): the user namespace of
   the non-root path kept them all, enough to chroot out of the jail.
   ``ctypes`` leaves ``sys.modules``, its classes are collected, its
   metaclasses make only inert types (`inert_ctypes`) and the import
   machinery's doors that copy a loaded C module are closed (`drop_ctypes`).
3. ``setrlimit``: address space, CPU seconds, file size 0, 3 open files, no
   new processes. Then the report of what was granted (``isolation``) goes out
   before any reward code has run, so the code cannot forge it.
4. The code is compiled, then an audit hook (PEP 578) is installed that
   refuses every audited event from then on: imports, ``open``, ``os.*``,
   sockets, ``ctypes`` calls, ``sys._getframe`` and the frame and code
   attributes (``gi_frame``, ``tb_frame``, ``cr_frame``, ``__code__``, ...),
   ``compile``/``exec``, new audit hooks; the calls no event covers
   (`REFUSED_OS`) are replaced and ``sys`` loses its streams. The code's module body runs as a
   function (no ``exec`` event) with globals holding only ``math`` and the
   allowed builtins.
5. Calls: one JSON line in, one JSON line out. The reward is called from
   `serve`, a function whose globals hold only a few builtins; the script's own
   globals (``os``, ``sys``, ...) are emptied before `serve` starts. Each
   value is checked here (type, finite, limit, component names), and again by
   the parent, which trusts nothing this process writes.

Every layer holds alone: the tests switch off the static check, the builtins
restriction and the audit hook (``AUDIT=0``) and try.
"""

import errno
import json
import math
import os
import resource
import signal
import sys
import types

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 38, 47, 4
CAPABILITY_VERSION_3 = 0x20080522
MAX_COMPONENTS, MAX_NAME = 32, 64


def isolate(jail: str, uid_base: int) -> dict:
    """Namespaces, a jail of its own, chroot, uid, no capabilities (steps 1-2); returns what was granted.

    The caller of a PID namespace forks here and never returns (`wait_and_relay`)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    root = os.getuid() == 0
    user = 0 if root else CLONE_NEWUSER
    iso: dict = dict.fromkeys(("netns", "pidns", "chroot", "jail", "no_caps", "own_uid", "no_ctypes", "audit"), False)
    iso["uid"] = os.getuid()
    tries = ((CLONE_NEWNET | CLONE_NEWPID, ("netns", "pidns")), (CLONE_NEWNET, ("netns",)), (CLONE_NEWPID, ("pidns",)))
    mountns = False  # with a mount namespace first; where the kernel refuses one, the others alone
    for flags, keys, ns in (*((f | CLONE_NEWNS, k, True) for f, k in tries), (CLONE_NEWNS, (), True),
                            *((f, k, False) for f, k in tries)):  # fmt: skip
        if libc.unshare(flags | user) == 0:
            iso.update(dict.fromkeys(keys, True))
            mountns = ns
            break
    outer_pid = os.getpid()
    if iso["pidns"]:
        child = os.fork()
        if child:
            wait_and_relay(child)
    if mountns:  # an empty read-only tmpfs over the jail folder: no file in the jail is the caller's
        libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)  # nothing mounted here reaches the caller
        hidden = MS_NOSUID | MS_NODEV | MS_NOEXEC
        if libc.mount(b"tmpfs", jail.encode(), b"tmpfs", hidden, b"size=4k,nr_inodes=2,mode=0555") == 0:
            iso["jail"] = libc.mount(None, jail.encode(), None, MS_REMOUNT | MS_RDONLY | hidden, None) == 0
    try:
        os.chroot(jail)
        os.chdir("/")
        iso["chroot"] = True
    except OSError:
        os.chdir(jail)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for cap in range(64):  # the bounding set: no capability can come back (stops at the kernel's last one)
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if root:
        uid = uid_base + outer_pid
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # clears the permitted and effective sets
        iso["own_uid"] = True
    # plain bytes, not ctypes arrays: _ctypes caches every array type and keeps its item type (c_uint32,
    # which reads and writes any address) alive for good
    header = CAPABILITY_VERSION_3.to_bytes(4, sys.byteorder) + bytes(4)
    libc.capset(header, bytes(24))  # effective, permitted, inheritable (two 32-bit words each): all empty
    got = bytes(bytearray(b"\xff" * 24))  # a fresh object that capget fills
    iso["no_caps"] = libc.capget(header, got) == 0 and not any(got)
    iso["uid"] = os.getuid()
    if iso["pidns"]:  # dies with the process that relays its status (set after setuid, which clears it)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return iso


def wait_and_relay(child: int) -> None:
    """The namespace's caller: wait for its only child, then end the same way (exit code or signal)."""
    os.close(0)
    os.close(1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


REFUSED_OS: tuple[str, ...] = (
    "setsid",
    "setpgid",
    "setpgrp",
    "write",
    "writev",
    "pwrite",
    "pwritev",
    "sendfile",
    "splice",
)
REFUSED_OS += ("copy_file_range", "pipe", "pipe2", "memfd_create", "eventfd", "dup", "dup2", "openpty", "login_tty")
"""Calls no audit event covers that reward code reaches through module globals (``math.__loader__.create_module
.__globals__`` holds ``sys`` and ``posix``): new sessions, raw writes (forged replies), new descriptors."""
REFUSED_IMP = ("create_dynamic", "create_builtin", "exec_dynamic", "exec_builtin", "init_frozen", "get_frozen_object")
"""The import machinery's own doors: each makes a fresh copy of a loaded C module (``_ctypes``, ``posix``)."""


def refuser(name: str):
    """A stand-in that refuses a call like the audit hook does (its closure holds only the name)."""

    def refused(*args, **kwargs):
        raise PermissionError(f"sandbox: '{name}' is not allowed")

    return types.FunctionType(
        refused.__code__, {"__builtins__": {"PermissionError": PermissionError}}, name, None, refused.__closure__
    )


TYPE_SLOTS = {"tp_flags": 168, "tp_base": 256, "tp_new": 312}
"""Byte offsets in CPython's ``PyTypeObject`` (3.11-3.13, 64-bit), checked against each type's flags and base."""
HEAPTYPE = 1 << 9


def inert_ctypes(ctypes, _ctypes) -> bool:
    """From now on the metaclasses of `_ctypes`'s static types make plain types (their ``tp_new`` is ``type``'s):
    such a class has no storage info, so it reads, writes and calls nothing ("abstract class"). The static types
    stay reachable after ctypes has gone (``().__class__.__base__.__subclasses__()``); a subclass of one made the
    usual way reads any address (``from_address``) or calls one. False, and nothing changed, where the layout of
    a type object is not the one expected."""
    bases = (_ctypes._SimpleCData, _ctypes.CFuncPtr, _ctypes._Pointer, _ctypes.Array, _ctypes.Structure)
    metas = list(dict.fromkeys(type(t) for t in (*bases, _ctypes.Union)))

    def slot(t, name):
        return ctypes.c_size_t.from_address(id(t) + TYPE_SLOTS[name])

    for t in (type, *metas):
        if sys.maxsize != 2**63 - 1 or slot(t, "tp_flags").value != t.__flags__:
            return False
        if slot(t, "tp_base").value != id(t.__base__) or t.__flags__ & HEAPTYPE:
            return False
    for meta in metas:
        slot(meta, "tp_new").value = slot(type, "tp_new").value
    return True


def ctypes_classes() -> list:
    """The classes of ctypes left: any class made by its Python modules, and any ``_CData`` subclass that is not
    one of `_ctypes`'s static types (each is a door to raw memory)."""
    seen, todo = set(), [object]
    found = []
    while todo:
        cls = todo.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        todo.extend(type.__subclasses__(cls))
        cdata = cls.__flags__ & HEAPTYPE and any(b.__module__ == "_ctypes" for b in cls.__mro__[1:])
        if cdata or str(cls.__module__).split(".")[0] == "ctypes":
            found.append(cls)
    return found


def drop_ctypes() -> bool:
    """No ``ctypes`` once isolation is set up: its modules leave ``sys.modules`` and cannot be loaded again
    (the jail holds no file, and the import machinery cannot copy a loaded C module); its classes are
    collected (their methods' globals were the whole module) and new ones are inert. True if none is left."""
    import _ctypes
    import _imp
    import ctypes
    import gc

    inert = inert_ctypes(ctypes, _ctypes)
    _ctypes._pointer_type_cache.clear()  # type: ignore[attr-defined]  # the types POINTER() made
    for cls in ctypes_classes():  # _ctypes holds some (c_void_p, py_object: the function types' arguments)
        for key, value in list(vars(cls).items()):  # where gc cannot see: no method may lead to the module
            if isinstance(value, types.FunctionType):
                delattr(cls, key)
    del ctypes, _ctypes
    for name in [n for n in sys.modules if n.split(".")[0] in ("ctypes", "_ctypes", "gc")]:
        del sys.modules[name]  # gc too: gc.get_objects() would hand out the _ctypes module
    sys.modules["ctypes"] = sys.modules["_ctypes"] = None  # type: ignore[assignment]  # import: refused
    while gc.collect():  # the function types go first, then the types their arguments held
        pass
    for name in REFUSED_IMP:
        if hasattr(_imp, name):
            setattr(_imp, name, refuser(f"_imp.{name}"))
    return inert and not [c for c in ctypes_classes() if door(c)]


def door(cls) -> bool:
    """Whether a class of ctypes leads anywhere: it derives from a `_ctypes` type (raw memory), or holds a method
    (whose globals are ctypes')."""
    functions = any(isinstance(v, types.FunctionType) for v in vars(cls).values())
    return functions or any(b.__module__ == "_ctypes" for b in cls.__mro__[1:])


def seal_runtime() -> None:
    """What the audit hook cannot see: the calls of `REFUSED_OS` and the standard streams in ``sys``."""
    for module in (os, sys.modules["posix"]):
        for name in REFUSED_OS:
            if hasattr(module, name):
                setattr(module, name, refuser(f"os.{name}"))
    for name in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"):
        setattr(sys, name, None)


def refuse(event, args, _error=PermissionError):
    """The audit hook: every event is refused (no globals read; its defaults cannot be changed unaudited)."""
    raise _error(f"sandbox: '{event}' is not allowed")


def verdict(value, entry: str, limit: float):
    """``("ok", value)`` for a well-formed return value, else ``("error", reason)``."""
    if entry == "recognize":
        if isinstance(value, bool):
            return "ok", value
        return "error", f"wrong return type: {type(value).__name__} (expected bool)"
    parts = value if isinstance(value, dict) else {"": value}
    if len(parts) > MAX_COMPONENTS:
        return "error", f"{len(parts)} reward components (at most {MAX_COMPONENTS})"
    for key, v in parts.items():
        if not isinstance(key, str) or len(key) > MAX_NAME:
            return "error", f"component names must be strings of at most {MAX_NAME} characters"
        if type(v) not in (int, float):
            got = type(v).__name__ if isinstance(value, dict) else type(value).__name__
            return "error", f"wrong return type: {got} (expected float, or a dict of named floats)"
    values = []
    for v in parts.values():
        try:
            values.append(float(v))
        except OverflowError:
            return "error", f"reward outside [-{limit:g}, {limit:g}] (an integer too large for a float)"
    odd = [v for v in values if not math.isfinite(v)]
    if odd:
        return "error", f"non-finite reward {odd[0]!r}"
    big = [v for v in [*values, sum(values)] if abs(v) > limit]
    if big:
        return "error", (
            f"reward {big[0]:.3g} outside [-{limit:g}, {limit:g}] (refused: it would overflow float32 training buffers)"
        )
    if isinstance(value, dict):
        return "ok", dict(zip(parts, values))
    return "ok", values[0]


def serve(fn, entry, limit, read, write, dumps, loads, check, _cleared=None):
    """The call loop; rebuilt with globals holding only a few builtins, so the reward's caller leaks nothing
    (``_cleared``: the script's globals were emptied while its arguments were evaluated)."""
    for line in read:
        try:
            kind, value = check(fn(loads(line)), entry, limit)
            reply = {kind: value}
        except MemoryError:
            reply = {"error": "memory limit exceeded"}
        except RecursionError:
            reply = {"error": "recursion too deep"}
        except BaseException as err:
            try:
                reply = {"error": f"raised {type(err).__name__}: {str(err)[:200]}"}
            except BaseException:
                reply = {"error": "raised an exception that cannot be shown"}
        write(dumps(reply) + "\n")


def main() -> tuple:
    """Steps 1-4; returns the call loop and its arguments."""
    mem, cpu, full, jail = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
    uid_base, limit, entry, audit = int(sys.argv[6]), float(sys.argv[7]), sys.argv[8], sys.argv[9] == "1"
    preimport = list(filter(None, sys.argv[5].split(",")))
    for name in preimport:  # tests only: modules an attacker wants, loaded first
        __import__(name)
    iso = isolate(jail, uid_base)
    iso["no_ctypes"] = "ctypes" not in preimport and drop_ctypes()
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (3, 3))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    out, inp = sys.stdout, sys.stdin

    def send(obj) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    names = json.loads(inp.readline())
    code = json.loads(inp.readline())
    import builtins

    safe = dict(vars(builtins)) if full else {n: getattr(builtins, n) for n in names}
    scope = {"__builtins__": safe, "math": math}
    try:
        body = compile(code, "<reward>", "exec")
    except MemoryError:
        send({"error": "memory limit exceeded while loading"})
        sys.exit(0)
    except BaseException as err:
        send({"error": f"failed to load: {type(err).__name__}: {err}"})
        sys.exit(0)
    few = ("type", "str", "MemoryError", "RecursionError", "BaseException", "isinstance", "len", "float", "dict")
    small = {n: getattr(builtins, n) for n in (*few, "zip", "sum", "abs", "bool", "int", "OverflowError")}
    loop = types.FunctionType(serve.__code__, {"__builtins__": small})
    limits = {"MAX_COMPONENTS": MAX_COMPONENTS, "MAX_NAME": MAX_NAME}
    check = types.FunctionType(verdict.__code__, {"__builtins__": small, "math": math, **limits})
    module = types.FunctionType(body, scope)  # the code's module body as a function: runs without an exec event
    iso["audit"] = audit
    send({"isolation": iso})  # before any of the code has run
    if audit:
        seal_runtime()
        sys.addaudithook(refuse)
    try:
        module()
        fn = scope[entry]
    except MemoryError:
        send({"error": "memory limit exceeded while loading"})
        sys.exit(0)
    except BaseException as err:
        send({"error": f"failed to load: {type(err).__name__}: {str(err)[:200]}"})
        sys.exit(0)
    send({"ready": True})

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    return loop, (fn, entry, limit, inp, write, json.dumps, json.loads, check)


if __name__ == "__main__":
    run = main()
    # the loop is looked up first, then its arguments; the last one empties the script's globals, so no frame
    # below the reward's holds os, sys or ctypes
    run[0](*run[1], globals().clear())  # type: ignore[func-returns-value]
