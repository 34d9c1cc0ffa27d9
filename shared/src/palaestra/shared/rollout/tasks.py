"""Single-turn tasks as environments: a task source plus a reward.

A task source (registry `TASKS`) returns samples: dicts with ``messages``
(the prompt, OpenAI-style), optionally ``tools``, and whatever its reward
reads (e.g. ``answer``, ``ground_truth``). `TaskEnv` (registered in `ENVS` as
``task``, lazily) plays one sample per episode: ``reset(seed)`` picks sample
``seed % len(samples)``, the model answers once, the reward (a registered
reward or a weighted composition) scores the text, the episode ends.

Built in, for tests and the learning demonstration: the ``next_number`` source
("continue the sequence 2 4 6" -> ``8``, the answer one digit out of a handful)
and the ``exact_answer`` reward.

>>> samples = next_number(num_samples=3)
>>> samples[0]["messages"][-1]["content"], samples[0]["answer"]
('Next number: 0 1 2', '3')
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated, Any

from palaestra.shared.config_checks import EntryKwargs, RegistryName
from palaestra.shared.registry import Registry
from palaestra.shared.rewards import REWARDS, compose, score
from palaestra.shared.rollout.env import Step, TextEnv

TaskSource = Callable[..., list[dict]]
TASKS: Registry[TaskSource] = Registry("task source", "palaestra.tasks")


class TaskEnv(TextEnv):
    """One sample of a task source per episode, answered in one turn, scored by a reward."""

    agents = ["agent"]

    def __init__(
        self,
        source: Annotated[str, RegistryName(TASKS)] = "next_number",
        reward: Annotated[str | dict[str, float], RegistryName(REWARDS)] = "exact_answer",
        source_kwargs: Annotated[dict[str, Any] | None, EntryKwargs(TASKS, "source")] = None,
        env_type: str | None = None,
    ):
        self.samples = TASKS.get(source)(**(source_kwargs or {}))
        if not self.samples:
            raise ValueError(f"task source {source!r} returned no samples")
        if isinstance(reward, str):
            fn = REWARDS.get(reward)
            self.reward = lambda sample, text: score(fn, sample, text)
        else:
            self.reward = compose(dict(reward))
        self.env_type = env_type or source
        self.sample: dict | None = None
        self._observed = False

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.sample = self.samples[(seed or 0) % len(self.samples)]
        self._observed = False
        return {"index": (seed or 0) % len(self.samples)}

    def observe(self, agent: str) -> list[dict]:
        if self._observed:
            return []
        self._observed = True
        assert self.sample is not None, "observe before reset"
        return list(self.sample["messages"])

    def tools(self, agent: str) -> list[dict] | None:
        return self.sample.get("tools") if self.sample else None

    def step(self, action: str) -> Step:
        value, parts = self.reward(self.sample, action)
        return Step(rewards={"agent": value}, terminated=True, info={"action": action.strip(), "reward_parts": parts})


@TASKS.register("next_number")
def next_number(
    num_samples: int = 8, max_start: int = 3, steps: tuple[int, ...] = (1, 2), length: int = 3, seed: int = 0
) -> list[dict]:
    """Arithmetic sequences whose next number is one digit: "Next number: 1 3 5" -> "7"."""
    combos = [(a, d) for d in steps for a in range(max_start + 1) if a + length * d <= 9]
    if not combos:
        raise ValueError("next_number: no sequence has a one-digit answer; lower max_start, steps or length")
    rng = random.Random(seed)
    out = []
    for i in range(num_samples):
        a, d = combos[i] if i < len(combos) else rng.choice(combos)
        seq = " ".join(str(a + k * d) for k in range(length))
        out.append({"messages": [{"role": "user", "content": f"Next number: {seq}"}], "answer": str(a + length * d)})
    return out


@REWARDS.register("exact_answer")
def exact_answer(sample: dict, completion: str, **info) -> float:
    """1.0 when the answer text (thinking removed) equals ``sample["answer"]`` exactly, else 0.0."""
    text = completion.split("</think>")[-1].strip()
    return float(text == str(sample["answer"]).strip())


@TASKS.register("next_number_format")
def next_number_format(seed: int = 0, **kwargs) -> list[dict]:
    """SFT data that teaches only the answer's form: every `next_number` prompt with every one of its answers.

    Balanced (each prompt paired once with each answer), so a model trained on
    it replies with one of the task's digits and stops, about uniformly, whatever
    the prompt; which digit is right for which prompt is left for RL (at the
    start the reward is about 1 / number of distinct answers).
    """
    base = next_number(seed=seed, **kwargs)
    answers = sorted({s["answer"] for s in base})
    return [{"messages": s["messages"] + [{"role": "assistant", "content": a}]} for s in base for a in answers]


TASKS.register("solver_critic_format", "palaestra.shared.rollout.solver_critic:solver_critic_format")  # its SFT data
