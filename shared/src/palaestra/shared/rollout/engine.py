"""The rollout engine: many text environments at once against one `LLMClient`.

Each loop collects every episode waiting for the model, makes one batched ``generate`` call for all of them
(rollout/batching.py), and steps each environment with its response.

Token-in, token-out (rollout/chat_tokens.py): an agent's first prompt is its messages rendered through the
chat template; every later prompt is the previous prompt + the response as generated + the template's tail
(what it renders after an assistant turn's content, through the next generation prompt). Nothing the model
wrote is re-tokenized and no earlier turn is re-rendered, so assembly is token-exact under any template, also
one that is not prefix-stable, and the turn's end comes from the template, not the tokenizer's ``eos_token``.
The policy thus sees its earlier responses verbatim, ``<think>`` blocks included, as verl's and ROLL's agent
loops give it; Qwen3's template, rendering the conversation whole, would drop them. ``rollout.context``
chooses that other view (``template``: each prompt the whole conversation re-rendered).

Limits: ``max_turns`` model calls per episode, ``max_tokens_per_turn``, and ``max_context_tokens`` per conversation.
An episode that hits one is kept and marked truncated (``Trajectory.limit`` says which). An environment (or the chat
template) that raises marks its episode's trajectories failed (error kept, counted as ``failed_episodes``); the rest
go on, and `check_failures` (called by the trainer on every rollout) warns about failures and stops the step past
``max_failed_share``. Seeds make a rollout reproducible with the transformers backend.

Versions: every response token is tagged with the policy version that sampled it (`Turn.response_versions`):
weights offered while episodes run load before the next generate call (rollout/policy_version.py), so a
multi-turn episode may span versions; under ``newest`` ahead of the learner, an interruptible client (the
transformers decode loop) also takes them at a token boundary inside the call, so one response may too.

Several policies (rl/policies.py): ``route(agent)`` names the client that samples each agent's turns; a
generate call then goes out per client (in the order their agents first wait; LoRA adapters of one vLLM engine
share one: rollout/batching.py), each client with its own version, chat tokens and response prefix. Without a
route every agent plays on the engine's client.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from palaestra.shared.config import value_check
from palaestra.shared.llm.base import Completion, LLMClient, SamplingParams
from palaestra.shared.rollout.batching import generate, group_requests
from palaestra.shared.rollout.chat_tokens import ChatTokens, ContextView
from palaestra.shared.rollout.env import TextEnv
from palaestra.shared.rollout.policy_version import PolicyVersion
from palaestra.shared.rollout.trajectory import Trajectory, Turn


class VersionSchedule(StrEnum):
    """Which weights a rollout running ahead of the learner samples with (``rollout.version_schedule``)."""

    newest = "newest"
    fixed = "fixed"


@dataclass
class RolloutConfig:
    """How episodes are sampled."""

    group_size: int = 1
    """Episodes per task (same reset seed): a GRPO group."""
    max_turns: int = 16
    """Model calls per episode (all agents together); reaching it truncates the episode."""
    max_tokens_per_turn: int = 256
    """Generated tokens per model call."""
    max_context_tokens: int = 4096
    """Prompt + response tokens per agent conversation."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """Sample among the k most likely tokens; 0 = off."""
    stop: list[str] = field(default_factory=list)
    response_prefix: str = ""
    """Text forced at the start of every response (e.g. MARS's ``"<think>\\n"``): its tokens go after the
    generation prompt as prompt tokens (not sampled, so not trained; MARS appends it to the prompt text), and the
    env's `step` gets the prefix + the generated text, the whole response as the env would read it."""
    response_prefix_in_loss: bool = False
    """Train the forced prefix as part of each response, as MARS's training mask has it (MARS puts the prefix back
    into the assistant message and re-tokenizes the conversation): a turn's ``response_ids`` begin with the
    prefix's ids, with sampler log-prob 0 (forced: probability 1 under the sampler). The tokens the model sees are
    the same either way; only the loss mask (and the per-turn token counts) differ."""
    max_failed_share: float = field(
        default=0.05, metadata=value_check("palaestra.shared.rollout.engine:check_failed_share")
    )
    """Share of a rollout's episodes that may fail (the environment or the chat template raised) before the
    trainer's step stops with an error naming the failures (`check_failures`); under it, failed episodes are
    left out of training, counted (``rollout/failed_episodes``, ``rollout/failed``) and reported in a warning."""
    max_staleness: int = field(default=0, metadata=value_check("palaestra.shared.config:check_non_negative"))
    """Steps of rollouts that may run ahead of the learner (rl/async_rollouts.py): a token sampled by policy
    version v trains an update of step <= v + max_staleness. 0: the synchronous loop (rollout, update, sync)."""
    version_schedule: VersionSchedule = VersionSchedule.newest
    """With max_staleness > 0: which weights a rollout ahead of the learner samples with (rl/async_rollouts.py).
    ``newest``: each generate call the newest weights offered, so an episode continues across an update;
    ``fixed``: a step's rollout all with the version it started with (step s: max(0, s - max_staleness) when
    the admission control defers nothing), a function of the config only: a resumed run is bit-exact."""
    context: ContextView = ContextView.generated
    """What a later turn's prompt holds (rollout/chat_tokens.py): ``generated``, the exact tokens sampled so far
    (one training sequence per conversation); ``template``, the conversation re-rendered whole by the model's
    template, as a chat endpoint shows it (a later prompt need not extend the earlier ones: training takes a row
    per run of turns that do, each turn on the prompt it was sampled on; rl/batch.py)."""
    max_inflight: dict[str, int] = field(default_factory=dict)
    """Admission control per task source (the env's name; the ``task`` env's ``source``): at most this many of
    its tasks in flight, over the steps running ahead of the learner. A step that would exceed it starts
    later (the step the learner takes always starts); nothing is discarded. Empty: no limit."""


@dataclass
class EpisodeSpec:
    """One task to play `group_size` times: how to make the env and the seed to reset it with."""

    make_env: Callable[[], TextEnv]
    seed: int
    group_id: str


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    stats: dict[str, float]


@dataclass
class _Episode:
    env: TextEnv
    spec: EpisodeSpec
    trajs: dict[str, Trajectory] = field(default_factory=dict)
    prompts: dict[str, list[int]] = field(default_factory=dict)
    history: dict[str, list[dict]] = field(default_factory=dict)
    """Each agent's messages so far, its responses as text (``rollout.context=template`` re-renders them)."""
    model_calls: int = 0
    done: bool = False
    failed: bool = False

    def traj(self, agent: str) -> Trajectory:
        if agent not in self.trajs:
            env_type = getattr(self.env, "env_type", "text")
            self.trajs[agent] = Trajectory(env_type=env_type, agent=agent, group_id=self.spec.group_id)
        return self.trajs[agent]

    def fail(self, err: BaseException) -> None:
        for agent in getattr(self.env, "agents", []):
            self.traj(agent)
        for t in self.trajs.values():
            t.failed, t.error = True, f"{type(err).__name__}: {err}"
        self.done = self.failed = True

    def truncate(self, limit: str) -> None:
        for t in self.trajs.values():
            t.truncated, t.limit = True, limit  # the limit that ended the episode wins
        self.done = True


@dataclass
class _Sampler:
    """One client the engine samples from: its weights' version, chat tokens and response prefix."""

    client: LLMClient
    policy: PolicyVersion
    chat: ChatTokens
    prefix_ids: list[int] = field(default_factory=list)


class RolloutEngine:
    """Drives episodes against `client` (or, with `route`, each agent's own client); `run` returns their
    trajectories and counts."""

    def __init__(self, client: LLMClient, cfg: RolloutConfig, route: Callable[[str], LLMClient] | None = None):
        self.client = client
        self.policy = PolicyVersion(client)
        """The version of the client's weights; the learner's weight sync offers new ones through it."""
        self.chat = ChatTokens(client)
        self.route = route
        self.samplers: dict[int, _Sampler] = {id(client): _Sampler(client, self.policy, self.chat)}
        """Every client sampled so far by id (the engine's own first); `route`'s are added as agents need them."""
        self._configure(cfg)

    def _configure(self, cfg: RolloutConfig) -> None:
        self.cfg = cfg
        # never ask the backend for more than the model holds: it would refuse the prompt and stop the run
        model_context = getattr(self.client, "context_length", None)
        self.max_context = min(cfg.max_context_tokens, model_context) if model_context else cfg.max_context_tokens
        prefix = cfg.response_prefix
        self.prefix_ids = self.client.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
        self.samplers = {k: self._with_prefix(s) for k, s in self.samplers.items()}

    def _with_prefix(self, sampler: _Sampler) -> _Sampler:
        prefix = self.cfg.response_prefix
        ids = sampler.client.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
        return dataclasses.replace(sampler, prefix_ids=ids)

    def sampler(self, agent: str) -> _Sampler:
        """The client (with its version, chat tokens, prefix) that samples `agent`'s turns."""
        return self.client_sampler(self.client if self.route is None else self.route(agent))

    def client_sampler(self, client: LLMClient) -> _Sampler:
        """`client`'s sampler, made at its first use (several policies' clients are registered up front, so each
        takes the weights and version of the first sync rather than meeting them at its agent's first turn)."""
        if id(client) not in self.samplers:
            self.samplers[id(client)] = self._with_prefix(_Sampler(client, PolicyVersion(client), ChatTokens(client)))
        return self.samplers[id(client)]

    def configured(self, cfg: RolloutConfig) -> RolloutEngine:
        """This engine (its client, weights and policy version) playing with other settings, e.g. an evaluation's
        (`palaestra.shared.rl.config.EvalConfig`); itself when they are its own."""
        if cfg == self.cfg:
            return self
        other = copy.copy(self)
        other._configure(cfg)
        return other

    def run(self, specs: Sequence[EpisodeSpec], seed: int = 0, cfg: RolloutConfig | None = None) -> RolloutResult:
        """Play `specs` (each ``group_size`` times); `cfg`: other settings for this run only (an evaluation's)."""
        if cfg is not None and cfg != self.cfg:
            return self.configured(cfg).run(specs, seed)
        start = time.perf_counter()
        episodes = [_Episode(spec.make_env(), spec) for spec in specs for _ in range(self.cfg.group_size)]
        for ep in episodes:
            self._guard(ep, functools.partial(self._reset, ep))
        gen_s, gen_tokens, calls = 0.0, 0, 0
        # newest weights ahead of the learner: an update may land inside a call (`fixed` stays bit-exact)
        newest = self.cfg.max_staleness > 0 and self.cfg.version_schedule == VersionSchedule.newest
        while True:
            waiting = [(ep, req) for ep in episodes if not ep.done for req in [self._prepare(ep)] if req]
            if not waiting:
                break
            # one call per client (or per vLLM engine's adapters)
            for group in group_requests(waiting, lambda item: self.sampler(item[1][0])):
                t0 = time.perf_counter()
                prompts = [prompt for _, (_, prompt) in group.items]
                results = generate(group, prompts, self._params(seed * 1_000_003 + calls), newest)
                gen_s += time.perf_counter() - t0
                calls += 1
                for (ep, (agent, prompt)), (completion, version) in zip(group.items, results, strict=True):
                    gen_tokens += len(completion.token_ids)
                    self._guard(ep, functools.partial(self._act, ep, agent, prompt, completion, version))
        trajs = [t for ep in episodes for t in ep.trajs.values()]
        stats = {
            "episodes": len(episodes),
            "trajectories": len(trajs),
            "failed": sum(t.failed for t in trajs),
            "failed_episodes": sum(ep.failed for ep in episodes),
            "truncated": sum(t.truncated for t in trajs),
            "generated_tokens": gen_tokens,
            "generate_calls": calls,
            "generate_s": gen_s,
            "rollout_s": time.perf_counter() - start,
        }
        return RolloutResult(trajs, stats)

    # -- one episode ------------------------------------------------------
    def _reset(self, ep: _Episode) -> None:
        info = ep.env.reset(seed=ep.spec.seed)
        for agent in ep.env.agents:
            ep.traj(agent).info["task"] = info

    def _prepare(self, ep: _Episode) -> tuple[str, list[int]] | None:
        """The acting agent and its next prompt, or None when the episode ends here."""
        try:
            agent = ep.env.current_agent
            messages = ep.env.observe(agent)
            traj = ep.traj(agent)
            sampler = self.sampler(agent)
            history = ep.history.setdefault(agent, [])
            history += messages
            if agent not in ep.prompts:
                prompt = sampler.chat.first(messages, ep.env.tools(agent))
            elif self.cfg.context == ContextView.template:
                prompt = sampler.chat.first(history, ep.env.tools(agent))
            else:
                last = traj.turns[-1]
                prompt = sampler.chat.extend(last.prompt_ids, last.response_ids, messages)
            prompt = prompt + sampler.prefix_ids
        except Exception as err:  # the env broke: this episode is lost, the rollout goes on
            ep.fail(err)
            return None
        if len(prompt) >= self.max_context:
            ep.truncate("context")
            return None
        ep.prompts[agent] = prompt
        return agent, prompt

    def _act(self, ep: _Episode, agent: str, prompt: list[int], completion: Completion, version: int = 0) -> None:
        ids, logprobs, finish = list(completion.token_ids), completion.logprobs, completion.finish_reason
        text, versions = completion.text, list(completion.extra.get("token_versions") or [version] * len(ids))
        room = self.max_context - len(prompt)
        cut = len(ids) > room
        if cut:  # a prefix of a sample is a sample: keep the tokens that fit
            ids, logprobs, finish = ids[:room], (logprobs[:room] if logprobs else logprobs), "context"
            versions = versions[:room]
            text = self.sampler(agent).client.tokenizer.decode(ids, skip_special_tokens=True)
        generated = len(ids)
        forced = self.sampler(agent).prefix_ids if self.cfg.response_prefix_in_loss else []
        if forced:  # the prefix moves from the prompt's end to the response's start: same tokens, now trained
            prompt, ids = prompt[: len(prompt) - len(forced)], forced + ids
            logprobs = [0.0] * len(forced) + list(logprobs) if logprobs else logprobs
            versions = [version] * len(forced) + versions  # not sampled: the version the call began with
        turn = Turn(agent, prompt, ids, list(logprobs) if logprobs else None, text=text, finish_reason=finish)
        turn.response_versions = versions
        ep.traj(agent).turns.append(turn)
        ep.model_calls += 1
        if cut:
            ep.truncate("context")
            return
        if finish == "length":
            ep.traj(agent).truncated, ep.traj(agent).limit = True, "max_tokens"
        ep.env.note_response(generated, truncated=finish == "length", prompt_tokens=len(prompt) + len(forced))
        ep.history.setdefault(agent, []).append({"role": "assistant", "content": self.cfg.response_prefix + text})
        step = ep.env.step(self.cfg.response_prefix + text)
        turn.action = step.info.get("action")
        turn.error = step.info.get("format_error")
        for who, reward in step.rewards.items():
            target = ep.traj(who)
            if target.turns:
                target.turns[-1].reward += float(reward)
            else:
                target.extra_reward += float(reward)
        if step.done:
            for t in ep.trajs.values():
                t.terminated, t.info["final"] = step.terminated, step.info
                t.truncated = t.truncated or step.truncated
            ep.done = True
        elif ep.model_calls >= self.cfg.max_turns:
            ep.truncate("max_turns")

    def _guard(self, ep: _Episode, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as err:
            ep.fail(err)

    # -- batched generation -------------------------------------------------
    def _params(self, seed: int) -> SamplingParams:
        """One generate call's sampling settings (a call's own seed: rollouts are reproducible)."""
        cfg = self.cfg
        return SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_tokens=cfg.max_tokens_per_turn,
            stop=list(cfg.stop),
            seed=seed,
        )


class RolloutFailures(RuntimeError):
    """More of a rollout's episodes failed than ``rollout.max_failed_share`` allows."""


def check_failed_share(value: float, owner: Any) -> str | None:
    """Config check of ``rollout.max_failed_share``: a share in [0, 1]."""
    return None if 0.0 <= value <= 1.0 else f"must be a share in [0, 1], got {value}"


def check_failures(result: RolloutResult, max_share: float) -> None:
    """Never drop a failed episode silently: warn with the most common errors, and raise `RolloutFailures`
    when more than `max_share` of the episodes failed (the step then stops instead of training on the rest)."""
    failed, episodes = int(result.stats.get("failed_episodes", 0)), int(result.stats.get("episodes", 0))
    if not failed:
        return
    errors = Counter(t.error for t in result.trajectories if t.failed).most_common(3)
    summary = f"{failed} of {episodes} episodes failed (by trajectory: " + "; ".join(f"{n} x {e}" for e, n in errors)
    summary += ")"
    if failed > max_share * episodes:
        raise RolloutFailures(f"{summary}: more than rollout.max_failed_share={max_share:g}")
    warnings.warn(f"{summary}; left out of training", stacklevel=2)
