"""Colocated rollout and learner: the vLLM engines sleep through the learner's update (``workers.llm.sleep_mode``,
set by the colocated layouts of rl/layout.py), as verl's hybrid engine and TRL's colocate mode do.

One RL step, in order (`Colocation`):

1. rollout, every engine awake;
2. ``sleep(level=1)`` on every engine: vLLM offloads its weights to CPU memory and discards its KV cache, so the
   learner's update has the GPU (`palaestra plan` prints what it frees);
3. the learner's update;
4. ``wake_up(tags=["weights"])``: the weights' memory back, then the weight sync writes the new weights into it;
5. ``wake_up(tags=["kv_cache"])``: the KV cache back (vLLM's advice: weights first, so that the sync does not
   meet a full GPU), the prefix cache reset by the sync (its blocks were the old weights');
6. the next rollout.

An engine that is asked to generate while asleep raises (`SleepingEngine`), so a wrong order fails loudly
instead of sampling from discarded memory.

Written against vLLM 0.32 (``LLM(enable_sleep_mode=True)``, ``LLM.sleep(level)``, ``LLM.wake_up(tags)``),
untested without a GPU: vLLM's CPU build refuses ``enable_sleep_mode`` ("Sleep mode is not supported on current
platform") and its CPU worker's ``sleep`` is a no-op. The order is tested on CPU against a recording engine
(shared/tests/test_sleep_mode.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from palaestra.shared.llm.base import LLMError

SLEEP_LEVEL = 1
"""vLLM's level 1: weights to CPU memory, KV cache discarded (level 2 would discard the weights too)."""
WAKE_ORDER: tuple[tuple[str, ...], ...] = (("weights",), ("kv_cache",))
"""What each ``wake_up`` call brings back; the weight sync runs between the two."""


class SleepingEngine:
    """The sleep state of one engine: `sleep`, `wake_up` and a guard that generation runs only fully awake.

    Mixed into `VLLMClient`; ``_sleep_engine`` is the `vllm.LLM` (or a test's recording engine)."""

    _sleep_engine: Any
    _asleep: set[str]

    def sleep(self, level: int = SLEEP_LEVEL) -> None:
        """Put the engine to sleep; idempotent (a second call while asleep does nothing)."""
        if getattr(self, "_asleep", None):
            return
        self._sleep_engine.sleep(level=level)
        self._asleep = {tag for tags in WAKE_ORDER for tag in tags}

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Bring back `tags` (None: everything) of a sleeping engine; a no-op when awake."""
        asleep: set[str] = getattr(self, "_asleep", set())
        if not asleep:
            return
        self._sleep_engine.wake_up(tags=list(tags) if tags is not None else None)
        self._asleep = set() if tags is None else asleep - set(tags)

    @property
    def asleep(self) -> bool:
        return bool(getattr(self, "_asleep", None))

    def check_awake(self) -> None:
        if self.asleep:
            raise LLMError(f"the vLLM engine is asleep ({', '.join(sorted(self._asleep))} released): wake it first")


class Colocation:
    """The trainer's side of one step (see the module docstring): `sleep` before the update, `wake` with the
    weight sync after. `call_all(method, *args)` calls a method of every engine's client and waits (on Ray
    workers: `ray_call_all`); None: no engine sleeps (`sleep` does nothing, `wake` only syncs)."""

    def __init__(self, call_all: Callable[..., None] | None = None):
        self.call_all = call_all
        self.asleep = False

    @classmethod
    def over(cls, rollouts: Any) -> Colocation:
        """For a Ray pool (rollout/workers.py `RayRollouts`) whose engines have sleep mode (``llm.sleep_mode``);
        any other rollouts: one that never sleeps."""
        llm = getattr(rollouts, "llm", None)
        sleeps = bool(getattr(llm, "sleep_mode", False)) and hasattr(rollouts, "workers")
        return cls(ray_call_all(rollouts) if sleeps else None)

    def sleep(self) -> None:
        if self.call_all is not None and not self.asleep:
            self.call_all("sleep", SLEEP_LEVEL)
            self.asleep = True

    def wake(self, sync: Callable[..., None], *args: Any) -> None:
        """Wake the weights, run ``sync(*args)`` (the weight sync), wake the KV cache."""
        if not self.asleep or self.call_all is None:
            sync(*args)
            return
        first, *rest = WAKE_ORDER
        self.call_all("wake_up", list(first))
        sync(*args)
        for tags in rest:
            self.call_all("wake_up", list(tags))
        self.asleep = False


def ray_call_all(rollouts: Any) -> Callable[..., None]:
    """`Colocation`'s ``call_all`` over a `RayRollouts` pool: each worker's ``weight_transfer`` RPC, which calls
    the method on its client (rollout/workers.py `RolloutWorker.weight_transfer`)."""

    def call_all(method: str, *args: Any) -> None:
        rollouts.ray.get([w.weight_transfer.remote(method, *args) for w in rollouts.workers])

    return call_all
