"""Test helpers shared by every package's tests (loaded by the root conftest.py).

- torch runs on one thread (two threads on a shared core degrade badly);
- `ray_local`: one small Ray instance for the whole session;
- `tracking`: a `TrackingConfig` on a fresh sqlite MLflow store in a temp dir;
- `tiny_llm`: the embedded `tiny` model through the transformers backend, built once;
- `tiny_server`: `palaestra serve tiny` in a child process (base URL), started once; skipped without the
  `serve` and `openai` extras;
- `tiny_learner`, `learner_step`, `greedy_rollouts`: a float32 `tiny` to train, one optimizer step on it, and
  the greedy rollouts of a client (what the weight-sync tests compare across backends);
- `switching_reference`: generation with no cache whose weights switch before a given token, written apart from
  the decode loop (what the interruptible-generation tests compare with);
- `small_train_config`: the few-second ``rl.train`` config that the trainer's tests vary;
- `vllm_tiny`: one vLLM engine on `tiny` (float32) for the whole session (an engine takes about a minute to
  start on CPU); tests that take it are marked ``vllm`` and skipped where vLLM is not importable (``make test``
  runs them in ``.venv-vllm``);
- `TakeTurns`: two agents alternating for four moves, the game of the several-policies and trainer tests (each
  subclass gives the reward per move its test needs).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import pytest

from palaestra.shared.config import ClusterConfig, JobConfig, TrackingConfig
from palaestra.shared.jobs import Job
from palaestra.shared.rollout.env import Step, TextEnv

TEST_CLUSTER = ClusterConfig(num_cpus=2, object_store_mb=128)


def pytest_configure(config) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM on CPU needs it, `tiny` needs little
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def pytest_collection_modifyitems(config, items) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if importlib.util.find_spec("vllm") is None:
        skip = pytest.mark.skip(reason="needs vLLM (make test runs these in .venv-vllm)")
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_local():
    from palaestra.shared import cluster

    ray = cluster.init(TEST_CLUSTER)
    yield ray


@pytest.fixture
def tracking(tmp_path) -> TrackingConfig:
    return TrackingConfig(
        experiment="test", uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "artifacts")
    )


@pytest.fixture(scope="session")
def tiny_llm():
    from palaestra.shared.llm import LLMConfig, make_client

    return make_client(LLMConfig(model="tiny", device="cpu"))


@pytest.fixture(scope="session")
def vllm_tiny():
    """A `VLLMClient` on `tiny` in float32, shared by the session; a test that changes its weights restores them."""
    from palaestra.shared.llm import LLMConfig, make_client

    client = make_client(LLMConfig(backend="vllm", model="tiny", dtype="float32", gpu_memory_utilization=0.2))
    yield client
    client.close()


@pytest.fixture(scope="session")
def tiny_server():
    """Base URL (``http://127.0.0.1:PORT/v1``) of ``palaestra serve tiny`` in a child process, shared by the session.

    Skips where the `serve` or `openai` extra is not installed (a package installed alone without them)."""
    for module in ("fastapi", "uvicorn", "openai"):
        pytest.importorskip(module, reason=f"needs {module}: pip install 'palaestra-shared[serve,openai]'")
    from palaestra.shared.llm.serve.launch import serve_in_subprocess

    with serve_in_subprocess("tiny") as url:
        yield url


def tiny_learner():
    """A fresh transformers client on `tiny` in float32 (its own model: a learner to take steps on)."""
    from palaestra.shared.llm import LLMConfig, make_client

    return make_client(LLMConfig(model="tiny", device="cpu", dtype="float32"))


def small_train_config(tmp_path, reward: str, **overrides: Any):
    """A `TrainConfig` of seconds on `tiny`: the ``task`` env scored by `reward`, groups of 3 five-token answers,
    2 tasks a step for 4 steps, AdamW at 1e-3, no MLflow, files under ``tmp_path/out``; `overrides` replace
    fields."""
    from palaestra.shared.rl.config import EnvSpec, OptimConfig, TrainConfig
    from palaestra.shared.rollout.engine import RolloutConfig

    base: dict[str, Any] = dict(
        envs=[EnvSpec("task", {"reward": reward})],
        job="rl.train",
        output_dir=str(tmp_path / "out"),
        tracking=TrackingConfig(enabled=False),
        rollout=RolloutConfig(group_size=3, max_tokens_per_turn=5),
        optim=OptimConfig(lr=1e-3),
        steps=4,
        tasks_per_step=2,
    )
    return TrainConfig(**{**base, **overrides})


def learner_step(client) -> None:
    """One AdamW step of next-token loss on a sentence: every weight moves, as after an RL update."""
    import torch

    model = client.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    ids = torch.tensor([client.tokenizer.encode("The answer is 42, and the next number is 43.")])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def two_weight_versions():
    """A `tiny` transformers client on its old weights, with those weights and the ones after one learner step."""
    import copy

    import torch

    from palaestra.shared.llm import LLMConfig, make_client

    torch.set_num_threads(1)
    client = make_client(LLMConfig(model="tiny", device="cpu", dtype="float32"))
    old = copy.deepcopy(client.model.state_dict())
    learner_step(client)
    new = copy.deepcopy(client.model.state_dict())
    client.model.load_state_dict(old)
    return client, old, new


def switching_reference(client, old: dict, new: dict, prompts: list, params, switch: int | None) -> list[list[int]]:
    """Each prompt's `params.n` rows of tokens from a transformers `client`, with no cache (a full forward over
    every live row's prompt and tokens at each step): weights `old`, then `new` from token `switch` on (None:
    never); the decode loop's sampling rule and random draws (rows in the client's order, by prompt length).
    `prompts`: text or token ids. The client's model is left holding `old`."""
    import torch

    from palaestra.shared.llm.hf_decode import filter_logits, sample

    model, eos = client.model, set(client.eos_token_ids)
    model.load_state_dict(old)
    encode = lambda p: list(p) if isinstance(p, list) else client.tokenizer.encode(p, add_special_tokens=False)
    rows = [encode(p) for p in prompts for _ in range(params.n)]
    tokens: list[list[int]] = [[] for _ in rows]
    live = sorted(range(len(rows)), key=lambda r: len(rows[r]))
    torch.manual_seed(params.seed if params.seed is not None else 0)
    for step in range(params.max_tokens):
        if step == switch:
            model.load_state_dict(new)
        ids, mask = client.batch_inputs([rows[r] + tokens[r] for r in live])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1, :].float()
        if params.temperature > 0:
            chosen = sample(filter_logits(logits, params.temperature, params.top_k, params.top_p)).tolist()
        else:
            chosen = logits.argmax(-1).tolist()
        for r, t in zip(live, chosen):
            tokens[r].append(t)
        live = [r for r, t in zip(live, chosen) if t not in eos]
        if not live:
            break
    model.load_state_dict(old)
    return tokens


def greedy_rollouts(client, episodes: int = 6, seed: int = 3) -> list:
    """``(group_id, response ids per turn)`` of greedy episodes of the ``task`` env, 8 tokens a turn."""
    import functools

    from palaestra.shared.rl.episodes import make_env
    from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine

    cfg = RolloutConfig(group_size=1, max_tokens_per_turn=8, temperature=0.0)
    specs = [EpisodeSpec(functools.partial(make_env, "task", {}), seed=i, group_id=str(i)) for i in range(episodes)]
    result = RolloutEngine(client, cfg).run(specs, seed)
    return [(t.group_id, [turn.response_ids for turn in t.turns]) for t in result.trajectories]


@dataclass
class ProbeConfig(JobConfig):
    """The probe job: a score from the seed, after a sleep."""

    scale: float = 1.0
    offset: float = 0.0
    sleep_s: float = 0.0
    rendezvous_dir: str | None = None
    """With `rendezvous_n`: leave a file here and wait (up to 120 s) until `rendezvous_n` runs have: proof that
    they ran at once."""
    rendezvous_n: int = 0


def probe(cfg: ProbeConfig, tracker: Any) -> dict:
    """Sleep, append (start, end, pid) to ``<output_dir>/runs.jsonl``, report ``score = seed * scale + offset``."""
    import json
    import time
    from pathlib import Path

    start = time.time()
    time.sleep(cfg.sleep_s)
    if cfg.rendezvous_dir:
        meeting = Path(cfg.rendezvous_dir)
        meeting.mkdir(parents=True, exist_ok=True)
        (meeting / f"{os.getpid()}-{time.time_ns()}").touch()
        deadline = time.time() + 120
        while len(list(meeting.iterdir())) < cfg.rendezvous_n:
            if time.time() > deadline:
                raise RuntimeError(f"only {len(list(meeting.iterdir()))} of {cfg.rendezvous_n} runs met")
            time.sleep(0.2)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps({"start": start, "end": time.time(), "pid": os.getpid()}) + "\n")
    return {"score": cfg.seed * cfg.scale + cfg.offset}


PROBE_JOB = Job("palaestra.shared.testing:PROBE_JOB", ProbeConfig, probe, metric="score")


class TakeTurns(TextEnv):
    """Two agents alternate for four moves, each move earning its mover `move_reward` of its answer (0 here)."""

    agents = ["p0", "p1"]
    env_type = "duel"
    moves = 4

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.t, self.seed = 0, seed
        return {}

    @property
    def current_agent(self) -> str:
        return self.agents[self.t % 2]

    def observe(self, agent: str) -> list[dict]:
        return [{"role": "user", "content": f"move {self.t}"}]

    def move_reward(self, action: str) -> float:
        return 0.0

    def step(self, action: str) -> Step:
        mover = self.current_agent
        self.t += 1
        return Step(rewards={mover: self.move_reward(action)}, terminated=self.t == self.moves)
