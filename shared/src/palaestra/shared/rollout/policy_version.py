"""The policy version a rollout client holds, and weights that arrive while it generates.

The learner's version is its step count: version v is the policy after v updates. A rollout engine asks
`PolicyVersion.generating` before every batched ``generate`` call: weights offered since the last call
(`offer`, from the learner's weight sync, possibly while an episode is half played) are loaded first,
and the call's tokens are tagged with the version then held. An episode that spans an update continues
with the new weights, and its earlier tokens keep their older versions.

Interruptible generation (the transformers decode loop, ``generate(..., at_boundary=...)``): the generate
call itself asks `at_boundary` at every token boundary, which loads weights offered meanwhile and returns
the version then held, so an update may also land inside one response; each token keeps the version that
sampled it. `at_boundary` runs inside `generating`, on the thread that holds the generate lock: it takes
only the offer lock (as `offer` does), never the generate lock, so it cannot deadlock.

In the synchronous loop the learner offers weights only between rollouts, and `generating` finds them
at the next rollout's first call: the same weights, loaded at the same point, as before versions existed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class PolicyVersion:
    """The version of a client's weights; `offer` queues newer weights (the newest wins)."""

    def __init__(self, client: Any, version: int = 0):
        self.client = client
        self.version = version
        self._pending: tuple[dict | None, int] | None = None
        self._offer_lock = threading.Lock()
        self._generate_lock = threading.Lock()  # one generate call (or weight load) at a time per client
        self._holder: int | None = None  # the thread inside `generating` (holding the generate lock)

    def offer(self, state_dict: dict | None, version: int) -> None:
        """Weights of `version` for the next generate call (None: the client already holds them, e.g. it shares
        the learner's model; only the version moves)."""
        with self._offer_lock:
            newest = self.version if self._pending is None else self._pending[1]
            if version >= newest:  # a late older offer never rolls the weights back
                self._pending = (state_dict, version)

    def load_now(self, state_dict: dict | None, version: int) -> None:
        """Load `state_dict` (if any) at once (between rollouts) and take its version."""
        self.offer(state_dict, version)
        with self._generate_lock:
            self._apply()

    def _apply(self) -> None:
        with self._offer_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        state, version = pending
        if state is not None:
            self.client.load_weights(state)
        self.version = version

    @contextmanager
    def generating(self) -> Iterator[int]:
        """Hold the client for one generate call, with the newest offered weights loaded; yields their version."""
        with self._generate_lock:
            self._holder = threading.get_ident()
            try:
                self._apply()
                yield self.version
            finally:
                self._holder = None

    def at_boundary(self) -> int:
        """At a token boundary of the generate call in flight: load the weights offered since (if any) and
        return the version held (hf_decode `AtBoundary`). Only inside `generating`, on its thread: elsewhere a
        load could land in another thread's generation, so it refuses."""
        if self._holder != threading.get_ident():
            raise RuntimeError("PolicyVersion.at_boundary is called inside generating(), on the thread holding it")
        self._apply()
        return self.version
