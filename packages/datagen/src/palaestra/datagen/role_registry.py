"""The one door for datagen roles: a registry of `RoleSpec`s and the protocols the pipeline calls.

A role is a part the pipeline plays per sample. Two kinds:

- a *stage* of HardGen's chain, in a fixed slot of the pipeline: ``tool_maker`` (``make``), ``query_writer``
  (``write``), ``reasoner`` (``act``), ``critic`` (``critique``);
- a *filter* after a sample is verified: ``check(row) -> FilterVerdict``, dropping it under a reason or
  keeping it with fields for ``verdict``. The LLM judge is one; any number can run, in registration order.

A new role is one file (its implementations) and one `register_role` call naming them as lazy
``"module:factory"`` strings; ``factory(ctx: RoleContext)`` builds one per worker. A new implementation of a
role is one more entry in its spec's ``implementations``. The config chooses one per role: the built-in
roles by their field of `pipeline.RolesConfig` (deterministic | llm), any role and any other implementation
under ``roles.others: {role: implementation}``; an unknown role or implementation fails at resolve time with
the known ones named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from palaestra.shared.registry import Registry, import_string

STAGES = ("tool_maker", "query_writer", "reasoner", "critic")
"""The chain's slots, in the order the pipeline calls them (HardGen's A_T, A_Q, A_R, A_C)."""
OFF = "off"
"""A filter's choice that runs nothing."""


@dataclass(frozen=True)
class RoleSpec:
    """A role: its name (the config key), its kind, and its implementations by name."""

    name: str
    kind: str
    """``stage`` (one of `STAGES`) or ``filter``."""
    implementations: dict[str, str]
    """Implementation name -> ``"module:factory"``; ``factory(ctx: RoleContext)`` returns the role object."""
    default: str
    """The implementation a config gets without choosing (``off`` for a filter that is not on by default)."""
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("stage", "filter"):
            raise ValueError(f"role {self.name!r}: kind must be 'stage' or 'filter', not {self.kind!r}")
        if self.kind == "stage" and self.name not in STAGES:
            raise ValueError(f"role {self.name!r}: a stage must be one of {', '.join(STAGES)}")
        if self.default != OFF and self.default not in self.implementations:
            raise ValueError(f"role {self.name!r}: default {self.default!r} is not an implementation")


@dataclass
class RoleContext:
    """What a factory may use: the roles' config and the shared LLM counter (None when no role is an LLM)."""

    cfg: Any
    counter: Any = None


@dataclass
class FilterVerdict:
    """A filter's answer: a drop reason (``<role>:<why>``) or None, and fields for the row's ``verdict``."""

    drop: str | None
    fields: dict[str, Any] = field(default_factory=dict)


class Filter(Protocol):
    """A role run on every verified sample (`FilterVerdict`)."""

    name: str
    """The implementation's name (``llm``), recorded in ``provenance.roles``."""
    role: str
    """The role's name (``judge``)."""

    def check(self, row: dict) -> FilterVerdict: ...


ROLES: Registry[RoleSpec] = Registry("datagen role")


def register_role(spec: RoleSpec) -> RoleSpec:
    ROLES.register(spec.name, spec)
    return spec


def add_implementation(role: str, name: str, factory: str) -> None:
    """One more implementation of a registered role (``factory``: ``"module:factory"``)."""
    spec = ROLES.get(role)
    if name in spec.implementations and spec.implementations[name] != factory:
        raise ValueError(f"role {role!r} already has an implementation {name!r}")
    spec.implementations[name] = factory


def role_names(kind: str | None = None) -> list[str]:
    """Registered roles (stages in chain order, then filters by name)."""
    specs = [ROLES.get(n) for n in ROLES.names()]
    stages = [s.name for s in specs if s.kind == "stage"]
    filters = [s.name for s in specs if s.kind == "filter"]
    ordered = sorted(stages, key=STAGES.index) + filters
    return [n for n in ordered if kind is None or ROLES.get(n).kind == kind]


def choice(cfg: Any, role: str) -> str:
    """The implementation `cfg` (`pipeline.RolesConfig`) picks for `role`: ``others[role]``, else the role's
    own field (a built-in one), else its default."""
    spec = ROLES.get(role)
    others = getattr(cfg, "others", None) or {}
    picked = others.get(role, getattr(cfg, role, None))
    return str(spec.default if picked is None else picked)


def build(role: str, ctx: RoleContext) -> Any:
    """The role object for `ctx.cfg`'s choice, or None for a filter that is off."""
    impl = choice(ctx.cfg, role)
    if impl == OFF:
        return None
    return import_string(ROLES.get(role).implementations[impl])(ctx)


def check_choices(value: dict, owner: Any) -> str | None:
    """``roles.others``: every key a registered role, every value one of its implementations."""
    for role, impl in value.items():
        if role not in ROLES:
            return ROLES.unknown_message(role)
        spec = ROLES.get(role)
        known = [*spec.implementations, *([OFF] if spec.kind == "filter" else [])]
        if impl not in known:
            return f"role {role!r} has no implementation {impl!r} (known: {', '.join(known)})"
    return None


# -- the built-in roles ---------------------------------------------------------------------------------
_R, _L = "palaestra.datagen.roles", "palaestra.datagen.llm_roles"
register_role(
    RoleSpec(
        "tool_maker",
        "stage",
        {"deterministic": f"{_R}:tool_maker", "llm": f"{_L}:tool_maker"},
        "deterministic",
        "A_T(trace) -> one composite tool schema for the whole trace.",
    )
)
register_role(
    RoleSpec(
        "query_writer",
        "stage",
        {"deterministic": f"{_R}:query_writer", "llm": f"{_L}:query_writer"},
        "deterministic",
        "A_Q(advanced tool) -> the user's request, a goal in a user's words.",
    )
)
register_role(
    RoleSpec(
        "reasoner",
        "stage",
        {"deterministic": f"{_R}:reasoner", "llm": f"{_L}:reasoner"},
        "deterministic",
        "A_R: answers a turn step by step (reasoning + calls), verified by replay.",
    )
)
register_role(
    RoleSpec(
        "critic",
        "stage",
        {"deterministic": f"{_R}:critic", "llm": f"{_L}:critic"},
        "deterministic",
        "A_C: a hint after a failed try that does not reveal the answer.",
    )
)
register_role(
    RoleSpec(
        "judge",
        "filter",
        {"llm": "palaestra.datagen.judge:llm_judge"},
        OFF,
        "Scores whether a verified sample's requests determine its calls; drops it under roles.judge_threshold.",
    )
)
