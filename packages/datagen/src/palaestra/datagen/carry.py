"""Cross-turn dependence: which tools can take a value an earlier turn's call returned.

FunReason-MT's dependent turns: a later request refers to an earlier result ("close the ticket you just
created") and the model carries the value across turns. `carry_targets` lists the tools with a parameter that
such a value can feed by the sampler's own rules (`sampler._producer`: a distinctive value at a compatible key,
the only candidate there), not one the user said before, and of the parameter's kind
(`coherence.kind_problem`). The pipeline draws a later turn's target among them (`P_CARRY`) and the sampler
then calls no producer of its own first (`sample_trace(carry=True)`), so the earlier turn's value is the one
the target takes; chains of such turns are dependent chains.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from palaestra.datagen.argfill import FREE_TEXT_PARAMS, TEXT_PARAMS, _value_like, compatible_key, records, superlative
from palaestra.datagen.coherence import kind_problem
from palaestra.datagen.sampler import TraceStep, _echo, _producer
from palaestra.datagen.schema import parameters, type_matches

P_CARRY = 0.8
"""Chance that a later (non-parallel) turn's target is one that can take an earlier turn's result."""
CARRY_TRIES = 5
"""Carry options tried (each a fresh trace) before the turn's target is drawn without one."""


def carry_targets(
    spec,
    outputs: Sequence[tuple[str, Any]],
    said: Sequence[dict],
    exclude: AbstractSet[str] = frozenset(),
    raw: Sequence[Any] = (),
) -> list[tuple[str, str, Any]]:
    """``(tool, parameter, value)`` for each tool of `spec` with a parameter that a value in `outputs` (earlier
    turns' response entries) can feed, or a record of `raw` (earlier turns' responses) that a numeric field
    singles out (`argfill.superlative`), a value no earlier call was given (`said`: their arguments)."""
    given = TraceStep("", {f"{i}.{k}": v for i, a in enumerate(said) for k, v in a.items()}, None)
    out = []
    for tool in spec.tool_names:
        if tool in exclude:
            continue
        doc = spec.doc(tool)
        for param, pspec in parameters(doc).items():
            if param in TEXT_PARAMS or param in FREE_TEXT_PARAMS:
                continue  # free text is the user's to write, not a value to carry
            options = [
                value
                for key, value in outputs
                if compatible_key(param, pspec, key)
                and _value_like(value)  # an id, a name, a figure: not a sentence that came back
                and type_matches(value, pspec.get("type", "string"))
                and _producer(value, list(outputs), param, pspec) is not None
                and not _echo(value, given)
                and not kind_problem(key, param, doc, tool)
            ]
            options += [
                v
                for r in raw
                for rec in records(r)
                for key, v in rec.items()
                if compatible_key(param, pspec, key)
                and _value_like(v)
                and type_matches(v, pspec.get("type", "string"))
                and superlative(v, r, param, pspec) is not None
                and not _echo(v, given)
                and not kind_problem(key, param, doc, tool)
            ]
            if options:
                out.append((tool, param, options[-1]))  # the latest: the one the user just saw
    return out
