"""Where rollouts run: in the learner's process, or on Ray actors each holding a model replica.

Both kinds answer ``run(specs, seed, cfg=None) -> RolloutResult`` and ``sync(state_dict)``; ``cfg``
plays one rollout with other settings (the trainer's evaluation: `EvalConfig`, on the same workers and
weights as training).

- `LocalRollouts` drives the engine on the learner's own client; the client
  shares the learner's model object, so there are no weights to copy.
- `RayRollouts` starts ``num_workers`` `RolloutWorker` actors, each building its
  own client from the `LLMConfig` (send configs, not models). A step's episode
  specs are cut into one contiguous shard per worker; each shard has its own
  seed (from its index, not from the worker), so the result does not depend on
  which worker ran it. After each update the learner calls ``sync``: the state
  dict goes into the object store once (``ray.put``) and every worker loads it
  (``client.load_weights``: a tensor copy for transformers, vLLM's weight-update
  path for vllm). With ``weight_sync="nccl"`` (vLLM workers on GPUs) the weights
  go over NCCL instead (rollout/vllm_weight_sync.py). A worker that dies is
  replaced, given the current weights, and its shard is run again.

``sync(state_dict, version)`` also tells the engines the policy version of those
weights (rollout/policy_version.py), which tags every generated token. With
``concurrent=True`` (rl/async_rollouts.py) a worker takes new weights while it
runs (`RolloutWorker.offer_weights`): they load before its next generate call.
With ``pin_versions=True`` (``rollout.version_schedule: fixed``) `sync` only keeps
the weights; every rollout carries the version that is newest when it is
submitted and samples with it throughout (a worker runs its rollouts in order,
loading each one's weights when they differ from the ones it holds), also when
its shard runs again on a replacement.
``submit`` starts a rollout and ``collect`` waits for it (``run`` is both).

Several policies (rollout/serving.py): each worker holds a `Replica` serving them all, either LoRA adapters on
one base model (`AdapterServing`: one adapter per policy) or one model per policy (`ModelServing`:
separate weights, each policy's own ``llm``); each agent's turns are sampled by its policy's
client, and a sync carries each policy's weights by key (adapter or policy name: the adapters' tensors alone,
or each model's state dict), each part loading into its own policy's client alone, with the version it names
(pinned, offered or loaded now, as above). NCCL weight sync is for one model's weights only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from palaestra.shared.config import ClusterConfig
from palaestra.shared.extras import MissingExtraError
from palaestra.shared.llm.base import LLMClient, LLMConfig, LLMError, make_client
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine, RolloutResult
from palaestra.shared.rollout.policy_version import PolicyVersion
from palaestra.shared.rollout.serving import Serving, serve
from palaestra.shared.rollout.vllm_weight_sync import NcclWeightSync, WeightSync


class LocalRollouts:
    """Rollouts in this process, on the learner's own client."""

    def __init__(
        self,
        client: LLMClient,
        cfg: RolloutConfig,
        route: Callable[[str], LLMClient] | None = None,
        clients: Sequence[LLMClient] = (),
    ):
        # route: each agent's client when several policies play (rollout/serving.py); they too share their models.
        # clients: every policy's, registered now so each takes every sync's version
        self.engine = RolloutEngine(client, cfg, route)
        for c in clients:
            self.engine.client_sampler(c)

    def run(self, specs: Sequence[EpisodeSpec], seed: int, cfg: RolloutConfig | None = None) -> RolloutResult:
        return self.engine.run(specs, seed, cfg)

    def sync(self, state_dict: dict | None, version: int | None = None) -> None:
        # the engine's client holds the learner's model itself: only the version moves
        if version is not None:
            for sampler in list(self.engine.samplers.values()):
                sampler.policy.load_now(None, version)

    def close(self) -> None:
        pass


class Replica:
    """A model replica's engine and where weights load into it (a Ray worker's, or rl/async_rollouts.py's
    background engine). One policy: the engine's client takes the whole state dict. Several policies
    (`serving`, rollout/serving.py): a client per policy, each agent's turns on its policy's client; a state
    holds each policy's part by key (adapter or policy name), and each part loads into its own policy's client
    alone, which tags its tokens with its own version (no version runs ahead of the weights it names)."""

    def __init__(self, llm: LLMConfig, cfg: RolloutConfig, serving: Serving | None = None):
        self.parts: dict[str, PolicyVersion] = {}  # several policies: each key's client's version
        self.nested = serving is not None and serving.nested  # adapters take {adapter: tensors}, a model its dict
        clients: dict[str, Any] = {}
        route = None
        if serving is None:
            self.client = make_client(llm)
        else:
            self.client, clients, route = serve(llm, serving)
        self.engine = RolloutEngine(next(iter(clients.values()), self.client), cfg, route)
        self.policy = self.engine.policy
        for key, client in clients.items():  # every client registered now: each takes the first sync
            self.parts[key] = self.engine.client_sampler(client).policy

    def run(self, specs: Sequence[EpisodeSpec], seed: int, cfg: RolloutConfig | None = None) -> RolloutResult:
        return self.engine.run(specs, seed, cfg)

    def _parts(self, state: dict | None) -> list[tuple[PolicyVersion, dict | None]]:
        """Each client's version holder and its part of `state` (one policy: the engine's, all of it)."""
        if not self.parts:
            return [(self.policy, state)]
        part = lambda key: None if state is None else {key: state[key]} if self.nested else state[key]  # noqa: E731
        return [(policy, part(key)) for key, policy in self.parts.items()]

    def load_now(self, state: dict | None, version: int) -> None:
        """Load `state` (None: only the version moves) at once and take its version."""
        for policy, part in self._parts(state):
            policy.load_now(part, version)

    def offer(self, state: dict | None, version: int) -> None:
        """`state` for each client's next generate call (rollout/policy_version.py)."""
        for policy, part in self._parts(state):
            policy.offer(part, version)

    def load(self, state: dict) -> None:
        """Load `state` now, keeping the version."""
        for policy, part in self._parts(state):
            policy.client.load_weights(part)


class RolloutWorker:
    """A Ray actor: one model replica and an engine (wrapped with ``ray.remote`` by `RayRollouts`); several
    policies: a `Replica` serving each (``serving``)."""

    def __init__(
        self,
        llm: LLMConfig,
        cfg: RolloutConfig,
        torch_threads: int = 1,
        serving: Serving | None = None,
    ):
        import torch

        torch.set_num_threads(torch_threads)
        self.startup_error: Exception | None = None
        self.pinned_version: int | None = None  # the version of the last pinned rollout's weights, while held
        try:
            self.replica = Replica(llm, cfg, serving)
        except (LLMError, MissingExtraError, FileNotFoundError) as err:
            # the user's to fix (a missing backend or model): `pid` raises it in the driver, where the CLI prints
            # it in one line; raised here, Ray would also print the worker's traceback
            self.startup_error = err
            return
        self.client, self.engine = self.replica.client, self.replica.engine

    def run(
        self, specs: list[EpisodeSpec], seed: int, cfg: RolloutConfig | None = None, pinned: tuple | None = None
    ) -> RolloutResult:
        """`pinned`: (version, [weights' object ref]) this rollout samples with (loaded unless held already)."""
        if pinned is not None and pinned[0] != self.pinned_version:
            import ray

            self.replica.load_now(ray.get(pinned[1][0]), pinned[0])
            self.pinned_version = pinned[0]
        return self.engine.run(specs, seed, cfg)

    def load_weights(self, state_dict: dict | None, version: int | None = None) -> bool:
        """Load the weights now (None: they came another way, e.g. NCCL) and take their version."""
        if version is None:
            assert state_dict is not None, "weights without a version must be given"
            self.replica.load(state_dict)
        else:
            self.replica.load_now(state_dict, version)
        return True

    def offer_weights(self, state_dict: dict | None, version: int) -> bool:
        """Weights for the next generate call, also of a rollout running now (a concurrent actor)."""
        self.replica.offer(state_dict, version)
        self.pinned_version = None  # the weights held are no longer a pinned rollout's
        return True

    def weight_transfer(self, method: str, *args: Any) -> Any:
        """One call of vLLM's NCCL weight-transfer handshake on this worker's client (`VLLMClient`)."""
        return getattr(self.client, method)(*args)

    def pid(self) -> int:
        import os

        if self.startup_error is not None:
            raise self.startup_error

        return os.getpid()


class RayRollouts:
    """Rollouts spread over Ray actors; dead workers are replaced and their shard redone."""

    def __init__(
        self,
        llm: LLMConfig,
        cfg: RolloutConfig,
        num_workers: int,
        cluster: ClusterConfig | None = None,
        num_cpus: float = 1,
        num_gpus: float = 0,
        max_restarts_per_step: int = 3,
        weight_sync: WeightSync = WeightSync.object_store,
        concurrent: bool = False,
        pin_versions: bool = False,
        serving: Serving | None = None,
    ):
        from palaestra.shared import cluster as ray_cluster

        self.ray = ray_cluster.init(cluster, in_process="workers.num_workers=0")
        self.llm, self.cfg = llm, cfg
        # concurrent: a second thread takes weights while a rollout runs (they load between generate calls)
        options = {"max_concurrency": 4} if concurrent else {}
        self.actor_cls = self.ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, **options)(RolloutWorker)
        self.concurrent = concurrent
        if pin_versions and (concurrent or weight_sync == WeightSync.nccl):
            raise ValueError("pinned versions need sequential workers and weights through the object store")
        self.pin_versions = pin_versions
        self.serving = serving  # several policies (rollout/serving.py)
        self.version: int | None = None
        self.max_restarts = max_restarts_per_step
        self.weights_ref: Any = None
        self.restarts = 0
        self.nccl: NcclWeightSync | None = None
        free = self.ray.available_resources()
        unplaceable = free.get("CPU", 0.0) < num_workers * num_cpus or free.get("GPU", 0.0) < num_workers * num_gpus
        self.workers = [self._start() for _ in range(num_workers)]
        self._wait_started(num_workers * num_cpus, num_workers * num_gpus, unplaceable)
        if weight_sync == WeightSync.nccl:
            from palaestra.shared.llm.vllm_backend import engine_dtype

            self.nccl = NcclWeightSync(self.workers, self.ray.get, engine_dtype(llm))

    def _wait_started(self, cpus: float, gpus: float, short: bool, patience_s: float = 60.0) -> None:
        """Wait until every worker has loaded its model (fail here, not mid-step, if one cannot). Workers that
        Ray cannot place (`short`: the free CPUs/GPUs were short of their request, e.g. the learner ranks hold
        them) would wait forever: if they are still waiting after `patience_s` and nothing was freed, say so."""
        pending = [w.pid.remote() for w in self.workers]
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=len(pending), timeout=patience_s)
            self.ray.get(ready)
            free = self.ray.available_resources()
            if pending and short and free.get("CPU", 0.0) + free.get("GPU", 0.0) == 0:
                total = self.ray.cluster_resources()
                raise RuntimeError(
                    f"{len(pending)} rollout worker(s) not placed after {patience_s:.0f} s: the workers ask for "
                    f"{cpus:g} CPUs and {gpus:g} GPUs in all, and the Ray cluster (of {total.get('CPU', 0.0):g} "
                    f"CPUs and {total.get('GPU', 0.0):g} GPUs) had less free (raise cluster.num_cpus / num_gpus, "
                    "or lower workers.num_workers / num_cpus)"
                )

    def _start(self):
        worker = self.actor_cls.remote(self.llm, self.cfg, 1, self.serving)
        # pinned: each rollout brings its weights (the current ones would be newer than a rerun shard's)
        if self.weights_ref is not None and not self.pin_versions:
            self.ray.get(worker.load_weights.remote(self.weights_ref, self.version))
        return worker

    def sync(self, state_dict: dict | None, version: int | None = None) -> None:
        """Push new weights (of policy `version`) to every worker (one copy in the object store, or one NCCL
        broadcast). A concurrent pool offers them (`RolloutWorker.offer_weights`) without waiting."""
        if state_dict is None:
            return
        self.version = version
        if self.pin_versions:  # the next submitted rollouts carry them
            self.weights_ref = self.ray.put(map_tensors(state_dict, lambda t: t.detach().cpu()))
            return
        if self.nccl is not None:
            self.nccl.send(state_dict)
            if version is not None:
                self._call_all(lambda w: w.load_weights.remote(None, version))
            return
        self.weights_ref = self.ray.put(map_tensors(state_dict, lambda t: t.detach().cpu()))
        if self.concurrent and version is not None:
            # waited for (an offer returns at once, also while the worker generates): a concurrent actor runs its
            # calls on several threads, so an unawaited offer could land after a later rollout had started
            self._call_all(lambda w: w.offer_weights.remote(self.weights_ref, version))
            return
        self._call_all(lambda w: w.load_weights.remote(self.weights_ref, version))

    def run(self, specs: Sequence[EpisodeSpec], seed: int, cfg: RolloutConfig | None = None) -> RolloutResult:
        return self.collect(self.submit(specs, seed, cfg))

    def submit(
        self, specs: Sequence[EpisodeSpec], seed: int, cfg: RolloutConfig | None = None
    ) -> tuple[list[list[EpisodeSpec]], int, dict, list, RolloutConfig | None, tuple | None]:
        """Start a rollout: one shard per worker, each with its own seed; `collect` waits for it. `cfg`: other
        settings for this rollout only (an evaluation's; None: the workers' own)."""
        shards = _split(list(specs), len(self.workers))
        workers = self.workers
        # pinned: the weights' ref in a list, which Ray passes as it is (the worker fetches it only to load it)
        pinned = (self.version, [self.weights_ref]) if self.pin_versions and self.weights_ref is not None else None
        pending = {
            workers[i].run.remote(shard, seed * 1009 + i, cfg, pinned): i for i, shard in enumerate(shards) if shard
        }
        return shards, seed, pending, list(self.workers), cfg, pinned

    def collect(
        self, handle: tuple[list[list[EpisodeSpec]], int, dict, list, RolloutConfig | None, tuple | None]
    ) -> RolloutResult:
        """The result of a `submit`: a shard whose worker died runs again, whole, on its replacement (its
        episodes are neither lost nor counted twice; pinned, with the weights it was submitted with)."""
        shards, seed, pending, used, cfg, pinned = handle
        results: list[RolloutResult | None] = [None] * len(shards)
        restarts = 0
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1)
            ref = done[0]
            i = pending.pop(ref)
            try:
                results[i] = self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                restarts += 1
                self.restarts += 1
                if restarts > self.max_restarts:
                    raise RuntimeError(f"rollout workers died {restarts} times in one step; giving up") from None
                if self.workers[i] is used[i]:  # not yet replaced (by another rollout in flight)
                    self._replace(i)  # a fresh replica with the current weights
                used[i] = self.workers[i]
                pending[self.workers[i].run.remote(shards[i], seed * 1009 + i, cfg, pinned)] = i
        return _merge([r for r in results if r is not None], restarts)

    def _call_all(self, fn) -> None:
        refs = {fn(w): i for i, w in enumerate(self.workers)}
        for ref, i in refs.items():
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                self._replace(i)

    def _replace(self, i: int) -> None:
        self.workers[i] = self._start()
        if self.nccl is not None:  # a new NCCL group with the new worker, which gets the current weights
            self.nccl.reconnect(self.workers)

    def close(self) -> None:
        if self.nccl is not None:
            self.nccl.close()
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []


def map_tensors(state: dict, fn: Callable[[Any], Any]) -> dict:
    """`fn` of every tensor of a weights dict, keeping its nesting (several policies' are nested by adapter or
    policy)."""
    return {k: map_tensors(v, fn) if isinstance(v, dict) else fn(v) for k, v in state.items()}


def _split(items: list, parts: int) -> list[list]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def _merge(results: list[RolloutResult], restarts: int) -> RolloutResult:
    trajs = [t for r in results for t in r.trajectories]
    stats: dict[str, float] = {}
    for r in results:
        for k, v in r.stats.items():
            # times overlap across workers: the slowest one is the step's wall time
            stats[k] = max(stats.get(k, 0.0), v) if k.endswith("_s") else stats.get(k, 0) + v
    stats["worker_restarts"] = restarts
    return RolloutResult(trajs, stats)
