"""Executable API environments: BFCL's eight multi-turn environments and user-added ones.

An environment is a Python class whose public methods are the tools, plus
JSON-schema function docs (one per tool) and a list of initial scenarios
(configs passed to the instance's ``_load_scenario``). `ApiEnvSpec` bundles
them; `ToolEnv` is one live instance: `reset` returns it to the scenario's
initial state, `copy` forks it (deep copy), `execute` runs one call and
*never raises*: an exception, a bad argument or an ``{"error": ...}`` result
all come back as an `Execution` with ``ok=False`` and the error text as the
environment's response.

Adding your own environment (documented in the package README)::

    from palaestra.datagen.envs import ApiEnvSpec, register_env

    class Library:
        def _load_scenario(self, config): self.books = dict(config.get("books", {}))
        def borrow(self, title: str): ...

    register_env(ApiEnvSpec(name="Library", factory=Library, docs=[{...JSON schema...}],
                         scenarios=[{"books": {"Dune": 2}}]))

then name it in ``datagen.generate``'s ``envs`` list. A doc that is not a
valid function schema, or a doc without a matching method, is a `SchemaError`
at registration. The BFCL environments come from the ``bfcl-eval`` package:
classes in ``bfcl_eval.eval_checker.multi_turn_eval.func_source_code``, docs
in ``bfcl_eval/data/multi_turn_func_doc``; their initial states are drawn by
`palaestra.datagen.initial_states` (never BFCL's test configs).

Error conventions (`is_error_response`): BFCL's environments signal a failed
call in several ways, all of which make ``ok=False``: a dict with an
``error`` key (every environment); a string, or list of strings, starting
with "Error" (``TradingBot.get_watchlist``); a list of error dicts
(``TicketAPI.get_user_tickets`` logged out); a ``*_status`` or ``success``
key that is False (``authentication_status``, ``follow_status``,
``booking_status``, ``verification_status``, ``success``, ...) outside the
``*login_status`` queries; a ``verification_failure`` key; and the status
texts "... not found", "No user is currently logged in", "Already ...".
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from palaestra.datagen.initial_states import generate_state
from palaestra.datagen.schema import SchemaError, to_openai_tool, validate_tool_doc
from palaestra.shared.bfcl_data import bfcl_data_dir
from palaestra.shared.registry import Registry, import_string

BFCL_CLASSES = {  # class name -> (module, doc file)
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
BFCL_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"


@dataclass
class ApiEnvSpec:
    """An environment type: class, function docs, initial scenarios."""

    name: str
    factory: Any
    """The class (or a ``"module:Class"`` string) whose public methods are the tools."""
    docs: list[dict]
    """JSON-schema function docs, one per tool."""
    scenarios: list[dict] = field(default_factory=lambda: [{}])
    """Initial configs for ``_load_scenario`` (used when there is no `state_generator`)."""
    state_generator: Any = None
    """Optional ``fn(seed) -> config`` (or a ``"module:attr"`` string): a fresh initial state per sample."""
    arg_hints: Any = None
    """Optional ``{param_name: fn(instance, rng) -> candidate values}`` (or a ``"module:attr"`` string)."""
    bfcl_class: str | None = None
    """Class name in BFCL's checker (``involved_classes``), for BFCL environments."""

    def __post_init__(self):
        names = set()
        for doc in self.docs:
            validate_tool_doc(doc)
            if doc["name"] in names:
                raise SchemaError(f"environment {self.name!r}: tool {doc['name']!r} is documented twice")
            names.add(doc["name"])
        if not self.docs:
            raise SchemaError(f"environment {self.name!r} has no tool docs")
        if not self.scenarios:
            self.scenarios = [{}]

    @property
    def cls(self) -> type:
        return import_string(self.factory) if isinstance(self.factory, str) else self.factory

    def check_methods(self) -> None:
        """Every documented tool must be a public method of the class."""
        cls = self.cls
        missing = [d["name"] for d in self.docs if not callable(getattr(cls, d["name"], None))]
        if missing:
            raise SchemaError(f"environment {self.name!r}: documented tools without a method: {missing}")

    @property
    def tool_names(self) -> list[str]:
        return [d["name"] for d in self.docs]

    def doc(self, tool: str) -> dict:
        for d in self.docs:
            if d["name"] == tool:
                return d
        raise KeyError(f"environment {self.name!r} has no tool {tool!r}")

    def openai_tools(self, exclude: AbstractSet[str] = frozenset()) -> list[dict]:
        return [to_openai_tool(d) for d in self.docs if d["name"] not in exclude]

    def initial_state(self, seed: int) -> dict:
        """The initial config for `seed`: drawn by `state_generator`, else one of `scenarios`."""
        if self.state_generator is None:
            return copy.deepcopy(self.scenarios[seed % len(self.scenarios)])
        if isinstance(self.state_generator, str):
            self.state_generator = import_string(self.state_generator)
        return self.state_generator(seed)

    def hints(self) -> dict:
        if isinstance(self.arg_hints, str):
            self.arg_hints = import_string(self.arg_hints)
        return self.arg_hints or {}


API_ENVS: Registry[ApiEnvSpec] = Registry("datagen environment", "palaestra.datagen_envs")


def register_env(spec: ApiEnvSpec) -> ApiEnvSpec:
    """Add a user environment (validated: docs are schemas and every tool is a method)."""
    spec.check_methods()
    API_ENVS.register(spec.name, spec)
    return spec


def get_env(name: str) -> ApiEnvSpec:
    spec = API_ENVS.get(name)
    return spec() if callable(spec) and not isinstance(spec, ApiEnvSpec) else spec


@dataclass
class Execution:
    """The outcome of one call."""

    name: str
    arguments: dict
    output: Any
    """The environment's response (JSON-serializable); ``{"error": ...}`` on failure."""
    ok: bool

    @property
    def error(self) -> str | None:
        return None if self.ok else str(self.output.get("error") if isinstance(self.output, dict) else self.output)


class ToolEnv:
    """A live environment instance at some state."""

    def __init__(self, spec: ApiEnvSpec, scenario: int | dict = 0):
        """`scenario`: an initial config, or a seed for `ApiEnvSpec.initial_state`."""
        self.spec = spec
        self.scenario = copy.deepcopy(spec.initial_state(scenario) if isinstance(scenario, int) else scenario)
        self.instance: Any = None
        self.reset()

    def reset(self) -> ToolEnv:
        """Back to the scenario's initial state (a new instance)."""
        self.instance = self.spec.cls()
        loader = getattr(self.instance, "_load_scenario", None)
        if loader is not None:
            params = inspect.signature(loader).parameters
            config = copy.deepcopy(self.scenario)
            loader(config, long_context=False) if "long_context" in params else loader(config)
        return self

    def copy(self) -> ToolEnv:
        other = object.__new__(ToolEnv)
        other.spec, other.scenario = self.spec, self.scenario
        other.instance = copy.deepcopy(self.instance)
        return other

    def execute(self, name: str, arguments: dict | None = None) -> Execution:
        """Run one call; failures come back as the response, never as an exception."""
        arguments = dict(arguments or {})
        if name not in self.spec.tool_names:
            return Execution(name, arguments, {"error": f"no such function: {name}"}, False)
        try:
            method = getattr(self.instance, name)
            # BFCL methods have mutable defaults (post_tweet(mentions=[])) that later calls mutate in place;
            # an explicit fresh empty value keeps every execution, and the recorded call, independent of that
            for pname, default in _mutable_defaults(type(self.instance), name):  # type: ignore[arg-type]
                arguments.setdefault(pname, type(default)())
            # the method gets its own copy: environments keep argument lists in their state and mutate them later
            output = method(**copy.deepcopy(arguments))
        except (Exception, SystemExit, RecursionError) as err:  # a broken env must not take the process down
            return Execution(name, arguments, {"error": f"{type(err).__name__}: {err}"}, False)
        output = jsonable(output)
        failed = is_error_response(output)
        if not failed and not self.healthy():
            return Execution(name, arguments, {"error": "the call left the environment in a broken state"}, False)
        return Execution(name, arguments, output, not failed)

    def healthy(self) -> bool:
        """Whether the state can still be compared (a directory moved into itself makes it cyclic)."""
        try:
            return self.public_state() == copy.deepcopy(self.public_state())
        except (RecursionError, Exception):
            return False

    def same_state(self, other: ToolEnv) -> bool:
        try:
            return self.public_state() == other.public_state()
        except (RecursionError, Exception):
            return False

    def public_state(self) -> dict:
        """Public attributes (what BFCL's state checker compares)."""
        return {k: v for k, v in vars(self.instance).items() if not k.startswith("_")}


_STATUS_TEXT = re.compile(r"^(error\b|no user is currently logged in|already )|not found\b", re.IGNORECASE)


def is_error_response(output: Any) -> bool:
    """Whether a (JSON-able) response is a failure by any of the environments' conventions (module docstring)."""
    if isinstance(output, str):
        return bool(_STATUS_TEXT.search(output.strip()))
    if isinstance(output, list):  # ["Error: ..."] or [{"error": ...}]
        return bool(output) and all(isinstance(x, str | dict) and is_error_response(x) for x in output)
    if not isinstance(output, dict):
        return False
    if "error" in output or "verification_failure" in output:
        return True
    for key, value in output.items():
        if value is False and (key == "success" or (key.endswith("_status") and key != "login_status")):
            return True
        if key in ("status", "symbol", "message") and isinstance(value, str) and _STATUS_TEXT.search(value):
            return True
    return False


@cache
def _mutable_defaults(cls: type, name: str) -> tuple:
    try:
        params = inspect.signature(getattr(cls, name)).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple((p.name, p.default) for p in params if isinstance(p.default, list | dict | set))


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-serializable copy of a response (unknown objects become strings)."""
    if depth > 20:
        return str(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v, depth + 1) for v in value]
    return str(value)


# -- BFCL environments -------------------------------------------------------
def bfcl_spec(class_name: str) -> ApiEnvSpec:
    module, doc_file = BFCL_CLASSES[class_name]
    with open(bfcl_data_dir("the BFCL environments") / "multi_turn_func_doc" / doc_file) as f:
        docs = [json.loads(line) for line in f if line.strip()]
    return ApiEnvSpec(
        name=class_name,
        factory=f"{BFCL_MODULE}.{module}:{class_name}",
        docs=docs,
        state_generator=functools.partial(generate_state, class_name),
        arg_hints=f"palaestra.datagen.bfcl_hints:{class_name}",
        bfcl_class=class_name,
    )


for _cls in BFCL_CLASSES:
    API_ENVS.register(_cls, (lambda c: cache(lambda: bfcl_spec(c)))(_cls))  # type: ignore[arg-type]  # lazy
