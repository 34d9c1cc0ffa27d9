"""Multi-turn rollouts under real families' chat templates, including ones that are not prefix-stable.

The templates here are written for this test from the families' documented behaviour (no template text is
copied): a Qwen3-style ChatML template that drops the ``<think>`` block of assistant turns before the last user
message, and a Llama-3-style one (header tokens, ``<|eot_id|>`` ends a turn, tool results as ``ipython``). Every
later prompt must be the previous prompt + the response as generated + the template's closing + the new messages,
token for token, and the conversation must equal a rendering written out by hand.

Where a model's own tokenizer is on the machine (a lab's node), set ``PALAESTRA_TEST_TOKENIZERS`` to one or more
HF tokenizer directories (separated by ``os.pathsep``): the same rollout runs through their own templates.
"""

from __future__ import annotations

import copy
import os

import pytest

from palaestra.shared.config import ConfigError, resolve
from palaestra.shared.llm.base import Completion, LLMClient
from palaestra.shared.rl.config import TrainConfig
from palaestra.shared.rollout.engine import (
    EpisodeSpec,
    RolloutConfig,
    RolloutEngine,
    RolloutFailures,
    RolloutResult,
    check_failures,
)
from palaestra.shared.rollout.env import Step, TextEnv

# Qwen3's documented behaviour: ChatML turns; an assistant turn after the last user query renders its reasoning
# as "<think>\n...\n</think>\n\n" before the answer (an empty block when it has none and is the last message),
# while one before the last user query renders the answer alone; tool results go in a user turn, each wrapped in
# <tool_response> tags; consecutive tool results share that turn.
QWEN3_STYLE = """
{%- set ns = namespace(query=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.query = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role == 'assistant' -%}
    {%- set answer = m.content -%}{%- set thought = '' -%}
    {%- if '</think>' in answer -%}
      {%- set thought = answer.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}
      {%- set answer = answer.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    <|im_start|>assistant{{ '\\n' }}
    {%- if loop.index0 > ns.query and (loop.last or thought) -%}
      <think>{{ '\\n' + thought + '\\n' }}</think>{{ '\\n\\n' }}
    {%- endif -%}
    {{ answer }}<|im_end|>{{ '\\n' }}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|im_start|>user{%- endif -%}
    {{ '\\n' }}<tool_response>{{ '\\n' + m.content + '\\n' }}</tool_response>
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}<|im_end|>{{ '\\n' }}{%- endif -%}
  {%- else -%}
    <|im_start|>{{ m.role + '\\n' + m.content }}<|im_end|>{{ '\\n' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}
"""

# Llama 3's documented prompt format: <|begin_of_text|>, then per message a role header between
# <|start_header_id|> and <|end_header_id|>, a blank line, the trimmed content and <|eot_id|>; tool output under
# the "ipython" role; the generation prompt is the assistant header.
LLAMA3_STYLE = """
{{- '<|begin_of_text|>' -}}
{%- for m in messages -%}
  {{- '<|start_header_id|>' + ('ipython' if m.role == 'tool' else m.role) + '<|end_header_id|>\\n\\n' -}}
  {{- m.content | trim -}}{{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}
"""
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def qwen3_style(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.chat_template = QWEN3_STYLE
    return tok


def llama3_style(base_tokenizer):
    tok = copy.deepcopy(base_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3_TOKENS, "eos_token": "<|eot_id|>"})
    tok.chat_template = LLAMA3_STYLE
    return tok


def response_text(agent: str, k: int) -> str:
    """What the scripted policy answers at its k-th turn: reasoning, then an answer."""
    return f"<think>\n{agent} weighs move {k}\n</think>\n\nplay {k}"


class ScriptedClient(LLMClient):
    """A policy that answers `response_text` (its tokens, then the end-of-turn token) and records its prompts."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params=None):
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            text = self.tokenizer.decode(prompt)
            agent = "p1" if "you are p1" in text else "p0"
            k = text.count(" weighs move ")  # the policy's earlier answers in this conversation
            ids = self.tokenizer.encode(response_text(agent, k), add_special_tokens=False)
            ids.append(self.tokenizer.eos_token_id)
            for _ in range(params.n if params else 1):
                out.append(Completion(response_text(agent, k), list(ids), [0.0] * len(ids), list(prompt), "stop"))
        return out


class Duel(TextEnv):
    """Two seats take turns (p0, p1, p0, p1, ...); each seat is told the other's last move as a user message,
    or, with ``tool_results``, gets it back as a tool result."""

    agents = ["p0", "p1"]

    def __init__(self, moves: int = 6, tool_results: bool = False):
        self.moves, self.tool_results = moves, tool_results

    def reset(self, seed=None):
        self.t, self.last = 0, None
        return {}

    @property
    def current_agent(self):
        return self.agents[self.t % 2]

    def observe(self, agent):
        if self.t < 2:
            return [{"role": "user", "content": f"you are {agent}; board {self.t}"}]
        role = "tool" if self.tool_results else "user"
        return [{"role": role, "content": f"opponent: {self.last}; board {self.t}"}]

    def step(self, action):
        self.t, self.last = self.t + 1, action.split("</think>")[-1].strip()
        return Step(rewards={self.agents[(self.t - 1) % 2]: 0.1}, terminated=self.t >= self.moves)


def run_duel(client, episodes: int = 2, **env_kwargs) -> RolloutResult:
    specs = [EpisodeSpec(lambda: Duel(**env_kwargs), seed=i, group_id=str(i)) for i in range(episodes)]
    return RolloutEngine(client, RolloutConfig(max_turns=20, max_tokens_per_turn=64)).run(specs)


def hand_rendered(family: str, agent: str, observations: list[dict], turns: int) -> str:
    """The conversation text of `agent` after `turns` answers, written out from the family's format: each answer
    verbatim (its <think> block kept), then the next observations and the generation prompt."""
    if family == "qwen3":
        text = ""
        for k, obs in enumerate(observations[: turns + 1]):
            if obs["role"] == "tool":
                text += f"<|im_start|>user\n<tool_response>\n{obs['content']}\n</tool_response><|im_end|>\n"
            else:
                text += f"<|im_start|>user\n{obs['content']}<|im_end|>\n"
            text += "<|im_start|>assistant\n"
            if k < turns:
                text += response_text(agent, k) + "<|im_end|>\n"
        return text
    text = "<|begin_of_text|>"
    for k, obs in enumerate(observations[: turns + 1]):
        role = "ipython" if obs["role"] == "tool" else obs["role"]
        text += f"<|start_header_id|>{role}<|end_header_id|>\n\n{obs['content']}<|eot_id|>"
        text += "<|start_header_id|>assistant<|end_header_id|>\n\n"
        if k < turns:
            text += response_text(agent, k) + "<|eot_id|>"
    return text


def seat_observations(agent: str, moves: int, tool_results: bool) -> list[dict]:
    """What `Duel` shows `agent` before each of its turns."""
    seat = Duel.agents.index(agent)
    out = []
    for t in range(seat, moves, 2):
        if t < 2:
            out.append({"role": "user", "content": f"you are {agent}; board {t}"})
        else:
            other = Duel.agents[(t - 1) % 2]
            last = f"play {(t - 1) // 2}"
            assert other != agent
            out.append({"role": "tool" if tool_results else "user", "content": f"opponent: {last}; board {t}"})
    return out


def test_the_qwen3_style_template_is_not_prefix_stable(tiny_llm):
    """The premise: rendered whole, the conversation after a second user message is no extension of the first."""
    tok = qwen3_style(tiny_llm.tokenizer)
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"}]
    whole = tok.apply_chat_template(first, tokenize=False)
    longer = tok.apply_chat_template(first + [{"role": "user", "content": "c"}], tokenize=False)
    assert "<think>\nr\n</think>" in whole and "<think>" not in longer and not longer.startswith(whole)


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("tool_results", [False, True], ids=["user", "tool"])
def test_multi_turn_tokens_equal_the_hand_rendered_conversation(tiny_llm, family, tool_results):
    tok = (qwen3_style if family == "qwen3" else llama3_style)(tiny_llm.tokenizer)
    client = ScriptedClient(tok)
    moves = 6
    result = run_duel(client, moves=moves, tool_results=tool_results)
    assert result.stats["failed"] == 0 and result.stats["failed_episodes"] == 0
    assert len(result.trajectories) == 4
    for traj in result.trajectories:
        assert traj.terminated and len(traj.turns) == moves // 2
        seq = traj.to_sequence()  # raises unless every prompt extends the previous prompt + response
        observations = seat_observations(traj.agent, moves, tool_results)
        for k, turn in enumerate(traj.turns):
            want = hand_rendered(family, traj.agent, observations, k)
            assert tok.decode(turn.prompt_ids) == want
            assert turn.prompt_ids == tok.encode(want, add_special_tokens=False)
        # the model's tokens in the training sequence are exactly what it generated, <think> blocks included
        generated = [t for t, m in zip(seq.input_ids, seq.loss_mask) if m]
        assert generated == [t for turn in traj.turns for t in turn.response_ids]
        assert tok.decode(generated).count("<think>") == moves // 2


def test_real_sampling_through_the_qwen3_style_template_loses_no_episode(tiny_llm):
    """The issue's probe: a two-seat game sampled from `tiny` under the Qwen3-style template (8 of 8 trajectories
    were lost at each seat's second turn)."""
    client = copy.copy(tiny_llm)
    client.tokenizer = qwen3_style(tiny_llm.tokenizer)
    specs = [EpisodeSpec(lambda: Duel(moves=4), seed=i, group_id=str(i)) for i in range(4)]
    result = RolloutEngine(client, RolloutConfig(max_tokens_per_turn=6, max_turns=8)).run(specs, seed=1)
    assert result.stats["failed"] == 0 and len(result.trajectories) == 8
    for traj in result.trajectories:
        assert len(traj.turns) == 2
        traj.to_sequence()
        second = client.tokenizer.decode(traj.turns[1].prompt_ids)
        assert second.endswith(f"board {2 + Duel.agents.index(traj.agent)}<|im_end|>\n<|im_start|>assistant\n")


def _tokenizer_dirs() -> list[str]:
    return [d for d in os.environ.get("PALAESTRA_TEST_TOKENIZERS", "").split(os.pathsep) if d]


@pytest.mark.skipif(not _tokenizer_dirs(), reason="set PALAESTRA_TEST_TOKENIZERS to local HF tokenizer directories")
@pytest.mark.parametrize("path", _tokenizer_dirs() or ["none"])
def test_a_models_own_template(path):
    """A real tokenizer's own template: the delta of each turn is exactly what the template renders for the new
    message at the end of the whole conversation (whatever it does to earlier turns), and nothing is re-rendered."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    client = ScriptedClient(tok)
    result = run_duel(client, episodes=1, moves=6)
    assert result.stats["failed"] == 0, {t.error for t in result.trajectories}
    for traj in result.trajectories:
        traj.to_sequence()
        observations = seat_observations(traj.agent, 6, False)
        history: list[dict] = []
        for k, turn in enumerate(traj.turns):
            history.append(observations[k])
            if k:
                prev = traj.turns[k - 1]
                env_part = turn.prompt_ids[len(prev.prompt_ids) + len(prev.response_ids) :]
                whole = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
                assert whole.endswith(tok.decode(env_part)), (k, tok.decode(env_part))
                assert observations[k]["content"] in tok.decode(env_part)
            history.append({"role": "assistant", "content": tok.decode(turn.response_ids, skip_special_tokens=True)})


class Exploding(Duel):
    def step(self, action):
        raise RuntimeError("tool backend exploded")


def test_failed_episodes_are_counted_warned_and_stop_the_step_past_the_share(tiny_llm):
    client = ScriptedClient(qwen3_style(tiny_llm.tokenizer))
    makers = [Exploding] + [Duel] * 9
    specs = [EpisodeSpec(m, seed=i, group_id=str(i)) for i, m in enumerate(makers)]
    result = RolloutEngine(client, RolloutConfig(max_turns=20)).run(specs)
    assert result.stats["failed_episodes"] == 1 and result.stats["episodes"] == 10
    assert result.stats["failed"] == 2  # both seats of the broken episode
    with pytest.warns(UserWarning, match=r"1 of 10 episodes failed .*tool backend exploded"):
        check_failures(result, 0.1)
    with pytest.raises(RolloutFailures, match=r"1 of 10 episodes failed .*max_failed_share=0.05"):
        check_failures(result, 0.05)


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_max_failed_share_is_a_share(share):
    with pytest.raises(ConfigError, match="rollout.max_failed_share"):
        resolve(TrainConfig, {"job": "rl.train", "rollout": {"max_failed_share": share}})


def test_the_trainer_stops_a_step_whose_episodes_fail(tiny_llm, tmp_path):
    """The trainer used to train on what was left; now the step stops, naming the failure."""
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.rollout.env import ENVS

    if "exploding_duel" not in ENVS.names():
        ENVS.register("exploding_duel")(Exploding)
    cfg = resolve(
        TrainConfig,
        {
            "job": "rl.train",
            "output_dir": str(tmp_path),
            "tracking": {"enabled": False},
            "envs": [{"name": "exploding_duel"}],
            "rollout": {"max_tokens_per_turn": 4},
            "tasks_per_step": 2,
            "steps": 1,
        },
    )
    with Trainer(cfg) as trainer, pytest.raises(RolloutFailures, match="2 of 2 episodes failed"):
        trainer.train_step()


def test_the_trainer_logs_failed_episodes_under_the_share(tiny_llm, tmp_path):
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.rollout.env import ENVS

    if "exploding_duel" not in ENVS.names():
        ENVS.register("exploding_duel")(Exploding)
    cfg = resolve(
        TrainConfig,
        {
            "job": "rl.train",
            "output_dir": str(tmp_path),
            "tracking": {"enabled": False},
            "envs": [{"name": "exploding_duel"}, {"name": "task"}],
            "rollout": {"max_tokens_per_turn": 4, "group_size": 2, "max_failed_share": 1.0},
            "tasks_per_step": 6,
            "steps": 1,
        },
    )
    with Trainer(cfg) as trainer:
        broken = sum(spec.make_env.args[0] == "exploding_duel" for spec in trainer.draw_tasks(0))
        assert 0 < broken < 6  # the mixture drew both kinds
        with pytest.warns(UserWarning, match=f"{2 * broken} of 12 episodes failed"):
            metrics = trainer.train_step()
    assert metrics["rollout/failed_episodes"] == 2 * broken
    assert metrics["rollout/failed"] == 2 * 2 * broken  # two seats each
    assert metrics["rollout/trajectories"] == 2 * (6 - broken)
