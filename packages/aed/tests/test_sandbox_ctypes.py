"""The no-ctypes layer attacked alone: static check off, every builtin, audit hook off, as root and as nobody.

Each attack is run twice on the same program: with the layer (ctypes dropped once isolation is set up) and as a
control with it off (``_unsafe_preimport=("ctypes",)`` keeps ctypes loaded and skips the drop), where the same
program reads memory, calls libc, or crashes the worker. The routes: the classes ctypes made (their methods'
globals are the whole module), new subclasses of `_ctypes`'s static types (reachable from
``().__class__.__base__.__subclasses__()``), the metaclasses called without a base, a call at a raw address,
``gc.get_objects()``, and the module tables (``sys.modules``, ``__builtins__``) reached through loader globals.
"""

from __future__ import annotations

import pytest

from palaestra.aed.sandbox import SandboxedReward, run_once

STATE = {"t": 0.0}
LAYER = {"check": False, "_unsafe_full_builtins": True, "_unsafe_no_audit": True, "timeout_s": 10.0}
CONTROL = {**LAYER, "_unsafe_preimport": ("ctypes",)}
CLASSES = """
def classes():
    seen, todo = {}, [().__class__.__base__]
    while todo:
        c = todo.pop()
        if id(c) not in seen:
            seen[id(c)] = c
            todo.extend(type.__subclasses__(c))
    return list(seen.values())
def static(name):
    return [c for c in classes() if c.__module__ == '_ctypes' and c.__name__ == name][0]
"""
GETPID = "return float(libc.getpid())  # 1: PID 1 of its namespace"

ATTACKS = {
    # a method of a class ctypes made: its globals are the ctypes module
    "method globals": """
def reward(state):
    for c in classes():
        for v in vars(c).values():
            g = getattr(v, '__globals__', {})
            if 'CDLL' in g:
                libc = g['CDLL'](None)
                GETPID
    return -1.0
""",
    # a new subclass of a static type reads any address
    "new subclass reads memory": """
def reward(state):
    word = type('W', (static('_SimpleCData'),), {'_type_': 'P'})
    return float(word.from_address(id(state) + 8).value == id(dict))  # an object's type pointer
""",
    # a class ctypes made and _ctypes keeps (c_void_p: an argument type of ctypes' memmove) reads any address
    "a surviving class reads memory": """
def reward(state):
    left = [c for c in classes() if c.__flags__ & 512 and static('_CData') in c.__mro__]
    return float(sum(c.from_address(id(state) + 8).value == id(dict) for c in left if c.__name__ == 'c_void_p'))
""",
    "classes of ctypes left": """
def reward(state):
    return float(len([c for c in classes() if c.__flags__ & 512 and static('_CData') in c.__mro__]))
""",
}


def attack(name: str) -> str:
    return CLASSES + ATTACKS[name].replace("GETPID", GETPID)


@pytest.mark.parametrize(
    "name, held, control",
    [
        ("method globals", -1.0, 1.0),
        ("new subclass reads memory", "raised TypeError: abstract class", 1.0),
        ("a surviving class reads memory", 0.0, 1.0),
        ("classes of ctypes left", 0.0, None),
    ],
)
def test_no_class_of_ctypes_reaches_memory_or_libc(name, held, control):
    got = run_once(attack(name), STATE, **LAYER)
    assert got == held, got
    off = run_once(attack(name), STATE, **CONTROL)
    if control is None:
        assert isinstance(off, float) and off > 10, off  # dozens of ctypes classes with the layer off
    else:
        assert off == control, off


CRASHES = {
    # the metaclass called without a base made a type whose instances overran their memory
    "metaclass without a base": """
def reward(state):
    t = type(static('_SimpleCData'))('P', (), {'_type_': 'l'})
    return float(t.from_address(4096).value)
""",
    # no audit event covers a call at a raw address
    "call at a raw address": """
def reward(state):
    f = type('F', (static('CFuncPtr'),), {'_flags_': 1})
    return float(f(4096)())
""",
}


@pytest.mark.parametrize("name", sorted(CRASHES))
def test_new_ctypes_types_are_inert(name):
    code = CLASSES + CRASHES[name]
    assert run_once(code, STATE, **LAYER) == "raised TypeError: abstract class"
    assert "killed by SIGSEGV" in run_once(code, STATE, **CONTROL)


MODULE_DOORS = {
    # gc.get_objects() holds the _ctypes module: dlopen, dlsym, call_function
    "gc": """
import gc
def reward(state):
    m = [o for o in gc.get_objects() if type(o) is type(math) and getattr(o, '__name__', '') == '_ctypes'][0]
    return float(m.call_function(m.dlsym(m.dlopen(None), 'getpid'), ()))
""",
    "sys.modules": """
def reward(state):
    mods = math.__loader__.create_module.__globals__['sys'].modules
    m = mods['_ctypes']
    return float(m.call_function(m.dlsym(m.dlopen(None), 'getpid'), ()))
""",
    "__builtins__": """
def reward(state):
    m = math.__loader__.create_module.__globals__['__builtins__']['__import__']('_ctypes')
    return float(m.call_function(m.dlsym(m.dlopen(None), 'getpid'), ()))
""",
}


@pytest.mark.parametrize(
    "name, refusal",
    [
        ("gc", "failed to load: PermissionError: sandbox: '_imp.create_builtin' is not allowed"),
        ("sys.modules", "raised AttributeError: 'NoneType' object has no attribute 'call_function'"),
        ("__builtins__", "raised ModuleNotFoundError: import of _ctypes halted; None in sys.modules"),
    ],
)
def test_no_module_table_hands_out_ctypes(name, refusal):
    code = MODULE_DOORS[name]
    assert run_once(code, STATE, **LAYER) == refusal
    assert run_once(code, STATE, **CONTROL) == 1.0


def test_the_isolation_report_says_whether_ctypes_is_gone():
    for settings, gone in ((LAYER, True), (CONTROL, False)):
        fn = SandboxedReward("def reward(state):\n    return 0.0\n", **settings)
        try:
            assert fn.isolation["no_ctypes"] is gone, fn.isolation
        finally:
            fn.close()
