"""The micro-batcher of ``palaestra serve``: one worker thread runs every generation, merging concurrent requests.

A `ServeRequest` is one validated request: its prompts as token ids, its sampling
parameters, an optional per-token callback (streaming) and a cancel flag. The
worker takes the waiting jobs with equal sampling parameters (and no seed: a
seeded job runs alone, so its samples do not depend on its neighbours) into one
`generate` call, and routes each job its own completions.

Isolation: if a merged call fails, each of its jobs runs again alone, so only
the job at fault gets the error. Bounds: at most ``max_queue`` jobs wait or run
at once (`Overloaded` beyond). Cancellation: with a backend whose `generate`
takes ``on_step`` (transformers), a cancelled job's rows end at the next decode
step and a cancelled job that has not started never runs; `close` cancels
everything (shutdown).
"""

from __future__ import annotations

import bisect
import inspect
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from contextlib import suppress
from dataclasses import astuple, dataclass, field

from palaestra.shared.llm.base import Completion, LLMClient, SamplingParams

BATCH_WAIT_S = 0.005
"""How long the worker waits for more jobs to join a batch."""


class Overloaded(RuntimeError):
    """The queue is full: the server answers 503."""


class Cancelled(RuntimeError):
    """The client went away or the server is shutting down."""


@dataclass(eq=False)
class ServeRequest:
    prompts: list
    """Token-id lists (or text, for a backend without a local tokenizer)."""
    params: SamplingParams
    on_token: Callable[[int, int], None] | None = None
    """Called from the worker thread with (choice index, token id) after each decode step (streaming)."""
    future: Future = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class MicroBatcher:
    """Serializes generation on one client and merges concurrent compatible jobs into one batch."""

    def __init__(self, client: LLMClient, max_prompts: int = 256, max_queue: int = 64) -> None:
        self.client, self.max_prompts, self.max_queue = client, max_prompts, max_queue
        self.steps = "on_step" in inspect.signature(client.generate).parameters
        self.jobs: queue.Queue[ServeRequest] = queue.Queue()
        self.lock = threading.Lock()
        self.active = 0
        self.closed = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="palaestra-batcher").start()

    def submit(self, job: ServeRequest) -> Future:
        """Queue `job`; its future gets the completions. Raises `Overloaded` or `Cancelled` (shut down) at once."""
        with self.lock:
            if self.closed.is_set():
                raise Cancelled("the server is shutting down")
            if self.active >= self.max_queue:
                raise Overloaded(f"the server is busy ({self.active} requests queued or running; --max-queue)")
            self.active += 1
        job.future.add_done_callback(self._done)
        self.jobs.put(job)
        return job.future

    def generate(self, prompts: list, params: SamplingParams) -> list[Completion]:
        """Submit one job and wait for it."""
        return self.submit(ServeRequest(list(prompts), params)).result()

    def close(self) -> None:
        """Cancel every job, running or queued; refuse new ones."""
        self.closed.set()
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            _fail(job, Cancelled("the server is shutting down"))

    def _done(self, _future: Future) -> None:
        with self.lock:
            self.active -= 1

    def _loop(self) -> None:
        held: ServeRequest | None = None
        while True:
            first = held or self.jobs.get()
            held = None
            if self._skip(first):
                continue
            group = [first]
            if first.params.seed is None:
                deadline = time.monotonic() + BATCH_WAIT_S
                while sum(len(j.prompts) for j in group) < self.max_prompts:
                    try:
                        nxt = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if self._skip(nxt):
                        continue
                    if nxt.params.seed is None and _key(nxt.params) == _key(first.params):
                        group.append(nxt)
                    else:
                        held = nxt
                        break
            self._run(group)

    def _skip(self, job: ServeRequest) -> bool:
        if job.cancelled.is_set() or self.closed.is_set():
            _fail(job, Cancelled("cancelled before it ran"))
            return True
        return False

    def _run(self, group: list[ServeRequest]) -> None:
        try:
            outs = self._generate(group)
        except Exception as err:  # noqa: BLE001  (handed to the job at fault)
            if len(group) == 1:
                _fail(group[0], err)
                return
            for job in group:  # isolate: only the job at fault fails
                if not self._skip(job):
                    self._run([job])
            return
        start = 0
        for job in group:
            size = len(job.prompts) * job.params.n
            if job.cancelled.is_set() or self.closed.is_set():
                _fail(job, Cancelled("cancelled while it ran"))
            else:
                _resolve(job, outs[start : start + size])
            start += size

    def _generate(self, group: list[ServeRequest]) -> list[Completion]:
        prompts = [p for job in group for p in job.prompts]
        if not self.steps:
            return self.client.generate(prompts, group[0].params)
        n = group[0].params.n
        offsets = []  # first output position of each job
        total = 0
        for job in group:
            offsets.append(total)
            total += len(job.prompts) * n

        def on_step(positions: list[int], tokens: list[int]) -> list[bool]:
            stop = []
            closed = self.closed.is_set()
            for position, token in zip(positions, tokens):
                k = bisect.bisect_right(offsets, position) - 1
                job = group[k]
                cancelled = closed or job.cancelled.is_set()
                if job.on_token is not None and not cancelled:
                    try:
                        job.on_token(position - offsets[k], token)
                    except Exception:  # noqa: BLE001  (a broken listener ends its own job, not the batch)
                        job.cancel()
                        cancelled = True
                stop.append(cancelled)
            return stop

        return self.client.generate(prompts, group[0].params, on_step=on_step)  # type: ignore[call-arg]


def _fail(job: ServeRequest, err: BaseException) -> None:
    with suppress(InvalidStateError):  # already settled (shutdown raced the worker)
        job.future.set_exception(err)


def _resolve(job: ServeRequest, outs: list[Completion]) -> None:
    with suppress(InvalidStateError):
        job.future.set_result(outs)


def _key(params: SamplingParams) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in astuple(params))
