"""Flagged error-recovery trajectories (FunReason-MT ships them): a failing call, the error read, the right call.

Off by default (`ItemConfig.p_error_recovery` 0). When a turn is drawn for it, `mistake` looks for a wrong
first call: the turn's first step with one string argument changed ("report.txt" -> "report_old.txt") that
the environment answers with an error response (`envs.is_error_response`) and that leaves the state as it
was. The deterministic reasoner then makes that call first, reads the error and goes on with the trace; the
chain's replay check still passes (every ground-truth result is there, the final state is the same). The
row's turn says ``"error_recovery": true``; the ground truth is the trace, without the failing call.
"""

from __future__ import annotations

import random

from palaestra.datagen.envs import ToolEnv, is_error_response
from palaestra.shared.toolcall import ToolCall

WRONG = ["{v}_old", "old_{v}", "{v}2", "my_{v}"]
"""Ways a string value is got wrong (a stale or mistyped name)."""


def mistake(env: ToolEnv, trace, rng: random.Random) -> ToolCall | None:
    """A wrong version of the trace's first call that fails and changes nothing, or None."""
    if not trace.steps or getattr(trace, "parallel", False):
        return None
    step = trace.steps[0]
    carried = set(step.feeds) | set(step.prior_feeds)  # a value the request states, so the reasoner can fix it
    params = [p for p, v in step.arguments.items() if isinstance(v, str) and v and p not in carried]
    rng.shuffle(params)
    for param in params:
        wrong = rng.choice(WRONG).format(v=step.arguments[param])
        args = {**step.arguments, param: wrong}
        fork = env.copy()
        ex = fork.execute(step.name, args)
        if not ex.ok and is_error_response(ex.output) and fork.same_state(env):
            return ToolCall(step.name, args)
    return None


def recovery_thought(call: ToolCall, error: str) -> str:
    """The reasoning after the failing call: what came back, and that the next call uses the request's value."""
    return (
        f"{call.name} failed: {error[:120]}. I used a value the request does not give; I call it again with the "
        "one the request states."
    )
