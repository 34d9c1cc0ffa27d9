"""A solver-critic group chat on a verifiable task: a two-agent, cooperative environment to train on.

The ``solver`` answers a task (a `TASKS` source scored by a reward, as the ``task`` env plays it); the
``critic`` sees the task and that answer and replies with a critique; the solver reads it and answers again:
``rounds`` solver turns in all, speaking in turn (solver, critic, solver, ...), as the group chat of
``mars.mas`` (AutoGen-style, fixed order). The solver's last answer is scored and both agents get that reward
(the team's outcome), so the critic is trained on whether its critique led to a right answer.

``solver_critic_format`` (a task source, registered in rollout/tasks.py) is a warm start of the chat's forms
(the answer's form, critiques naming an answer, a final answer that follows the critique), leaving which
answer is right to RL.

The two roles may be one policy (self-play of both roles) or one each (rl/policies.py)::

    envs: [{name: solver_critic, kwargs: {source: next_number, reward: exact_answer, rounds: 2}}]
    policies: {solver: {agents: [solver]}, critic: {agents: [critic]}}
"""

from __future__ import annotations

from typing import Annotated, Any

from palaestra.shared.config_checks import EntryKwargs, RegistryName
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.rollout.tasks import TASKS, TaskEnv

CRITIQUE = "Task: {task}\nThe solver answered: {answer}\nPoint out a mistake, if there is one, in one short sentence."
AGAIN = "The solver answered again: {answer}\nPoint out a mistake, if there is one, in one short sentence."
REVISE = "The critic says: {critique}\nGive your final answer."


class SolverCriticEnv(TextEnv):
    """Solver, critic, solver, ...: ``rounds`` solver turns; the last one's reward goes to both agents."""

    agents = ["solver", "critic"]

    def __init__(
        self,
        source: Annotated[str, RegistryName(TASKS)] = "next_number",
        reward: Annotated[str | dict[str, float], RegistryName(REWARDS)] = "exact_answer",
        source_kwargs: Annotated[dict[str, Any] | None, EntryKwargs(TASKS, "source")] = None,
        rounds: int = 2,
        env_type: str | None = None,
    ):
        if rounds < 1:
            raise ValueError(f"solver_critic: rounds must be >= 1 (solver turns), got {rounds}")
        self.task = TaskEnv(source, reward, source_kwargs)
        self.rounds = rounds
        self.env_type = env_type or f"solver_critic_{source}"

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        info = self.task.reset(seed)
        assert self.task.sample is not None
        self.turns = 0
        self.pending: dict[str, list[dict]] = {"solver": list(self.task.sample["messages"]), "critic": []}
        return info

    @property
    def current_agent(self) -> str:
        return self.agents[self.turns % 2]

    def observe(self, agent: str) -> list[dict]:
        out, self.pending[agent] = self.pending[agent], []
        return out

    def step(self, action: str) -> Step:
        agent, text = self.current_agent, action.strip()
        self.turns += 1
        if agent == "critic":
            self.pending["solver"].append({"role": "user", "content": REVISE.format(critique=text)})
            return Step(rewards={}, info={"action": text})
        if self.turns >= 2 * self.rounds - 1:  # the solver's last answer: the team's outcome
            value, parts = self.task.reward(self.task.sample, action)
            return Step(
                rewards={"solver": value, "critic": value},
                terminated=True,
                info={"action": text, "reward_parts": parts},
            )
        if self.turns == 1:
            assert self.task.sample is not None
            task = self.task.sample["messages"][-1]["content"]
            self.pending["critic"].append({"role": "user", "content": CRITIQUE.format(task=task, answer=text)})
        else:
            self.pending["critic"].append({"role": "user", "content": AGAIN.format(answer=text)})
        return Step(rewards={}, info={"action": text})


def solver_critic_format(source: str = "next_number", **source_kwargs: Any) -> list[dict]:
    """SFT data of the chat's forms (as ``next_number_format`` for the task): for every task of `source` (whose
    samples carry an ``answer``) and every pair of its answers (x, y), the solver's chat (x, the critique
    "It is y.", then y) and the critic's (the task and the answer x, then "It is y."). Balanced: the critic
    names every answer equally often whatever the task, and the solver's final answer follows the critique;
    which answer is right is left for RL."""
    base = TASKS.get(source)(**source_kwargs)
    answers = sorted({str(s["answer"]) for s in base})
    out = []
    for s in base:
        task = s["messages"][-1]["content"]
        for x in answers:
            for y in answers:
                critique = f"It is {y}."
                solver = [
                    *s["messages"],
                    {"role": "assistant", "content": x},
                    {"role": "user", "content": REVISE.format(critique=critique)},
                    {"role": "assistant", "content": y},
                ]
                critic = [
                    {"role": "user", "content": CRITIQUE.format(task=task, answer=x)},
                    {"role": "assistant", "content": critique},
                ]
                out += [{"messages": solver}, {"messages": critic}]
    return out
