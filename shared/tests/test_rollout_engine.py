"""The rollout engine on the tiny model: token exactness, multi-turn/multi-agent bookkeeping, limits, failures."""

import pytest

from palaestra.shared.llm.base import SamplingParams
from palaestra.shared.rollout.batching import uniform_run_length
from palaestra.shared.rollout.chat_tokens import ChatTokens
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.rollout.tasks import TaskEnv, next_number


class ToolLoopEnv(TextEnv):
    """Multi-turn tool use: each action gets a tool response back; ends after `length` steps."""

    env_type = "tool_loop"

    def __init__(self, length=3, fail_at=None):
        self.length, self.fail_at = length, fail_at

    def reset(self, seed=None):
        self.t, self.seen, self.pending = 0, [], [{"role": "user", "content": f"task {seed}"}]
        return {"seed": seed}

    def observe(self, agent):
        out, self.pending = self.pending, []
        return out

    def step(self, action):
        self.t += 1
        if self.t == self.fail_at:
            raise RuntimeError("tool backend exploded")
        self.seen.append(action)
        self.pending = [{"role": "tool", "content": f"result {self.t}"}]
        return Step(rewards={"agent": 0.5}, terminated=self.t >= self.length, info={"action": f"a{self.t}"})


class TwoSeatEnv(TextEnv):
    """Alternating seats; when the game ends the last mover gets +1 and the other -1."""

    agents = ["p0", "p1"]
    env_type = "duel"

    def reset(self, seed=None):
        self.t, self.new = 0, {"p0": [{"role": "user", "content": "you are p0"}], "p1": []}
        return {}

    @property
    def current_agent(self):
        return self.agents[self.t % 2]

    def observe(self, agent):
        if agent == "p1" and self.t == 1:
            return [{"role": "user", "content": "you are p1; p0 moved"}]
        out, self.new[agent] = self.new[agent], []
        return out or [{"role": "user", "content": f"move {self.t}"}]

    def step(self, action):
        mover = self.current_agent
        self.t += 1
        if self.t == 4:
            other = "p0" if mover == "p1" else "p1"
            return Step(rewards={mover: 1.0, other: -1.0}, terminated=True)
        return Step(rewards={mover: 0.05})


def specs(factory, n):
    return [EpisodeSpec(factory, seed=i, group_id=str(i)) for i in range(n)]


def test_multi_turn_sequence_is_token_exact(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=6, max_turns=10))
    result = engine.run(specs(lambda: ToolLoopEnv(3), 3), seed=3)
    assert result.stats["failed"] == 0 and len(result.trajectories) == 3
    chat = ChatTokens(tiny_llm)
    tok = tiny_llm.tokenizer
    for traj in result.trajectories:
        assert len(traj.turns) == 3 and traj.terminated and traj.total_reward == pytest.approx(1.5)
        seq = traj.to_sequence()
        # the model's tokens, in order, are exactly the generated ones
        model_tokens = [t for t, m in zip(seq.input_ids, seq.loss_mask) if m]
        assert model_tokens == [t for turn in traj.turns for t in turn.response_ids]
        assert sum(seq.loss_mask) == traj.num_response_tokens
        # the first prompt is the template's rendering; later env tokens decode to the tool turns
        seed = traj.info["task"]["seed"]
        assert traj.turns[0].prompt_ids == tiny_llm.render([{"role": "user", "content": f"task {seed}"}])
        for k in (1, 2):
            env_part = seq.input_ids[len(traj.turns[k - 1].prompt_ids) + len(traj.turns[k - 1].response_ids) :]
            env_part = env_part[
                : len(traj.turns[k].prompt_ids)
                - len(traj.turns[k - 1].prompt_ids)
                - len(traj.turns[k - 1].response_ids)
            ]
            text = tok.decode(env_part)
            assert f"<tool_response>\nresult {k}\n</tool_response>" in text
            assert text.endswith("<|im_start|>assistant\n") and text.startswith(
                "\n" if traj.turns[k - 1].response_ids[-1] in chat.end_ids else "<|im_end|>"
            )
        # what the env saw is the decoded response
        assert [t.action for t in traj.turns] == ["a1", "a2", "a3"]


def test_responses_equal_plain_generation_on_the_same_prompt(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=8, temperature=0.0))
    traj = engine.run(specs(lambda: TaskEnv(), 2), seed=0).trajectories
    for t in traj:
        direct = tiny_llm.generate([t.turns[0].prompt_ids], SamplingParams(temperature=0.0, max_tokens=8))[0]
        assert t.turns[0].response_ids == direct.token_ids
        assert t.turns[0].response_logprobs == pytest.approx(direct.logprobs)


def test_response_prefix_is_prompt_tokens_and_the_env_reads_prefix_plus_response(tiny_llm):
    prefix = "<think>\n"
    cfg = RolloutConfig(max_tokens_per_turn=5, max_turns=10, temperature=0.0, response_prefix=prefix)
    envs = []
    trajs = RolloutEngine(tiny_llm, cfg).run(specs(lambda: envs.append(ToolLoopEnv(2)) or envs[-1], 2)).trajectories
    prefix_ids = tiny_llm.tokenizer.encode(prefix, add_special_tokens=False)
    assert prefix_ids and tiny_llm.tokenizer.decode(prefix_ids) == prefix
    for traj, env in zip(trajs, envs):
        seed = traj.info["task"]["seed"]
        rendered = tiny_llm.render([{"role": "user", "content": f"task {seed}"}])
        assert traj.turns[0].prompt_ids == rendered + prefix_ids  # right after the generation prompt
        seq = traj.to_sequence()
        for turn in traj.turns:
            start = len(turn.prompt_ids)
            # every response starts right after the prefix's exact ids, which are prompt (untrained) tokens
            assert seq.input_ids[start - len(prefix_ids) : start] == prefix_ids
            assert seq.loss_mask[start - len(prefix_ids) : start] == [0] * len(prefix_ids)
            assert seq.input_ids[start : start + len(turn.response_ids)] == turn.response_ids
        # greedy: the response is the plain continuation of template + prefix
        direct = tiny_llm.generate([rendered + prefix_ids], SamplingParams(temperature=0.0, max_tokens=5))[0]
        assert traj.turns[0].response_ids == direct.token_ids
        # the env read the whole response: the forced prefix, then the generated text
        assert env.seen == [prefix + turn.text for turn in traj.turns]
        assert all(s.startswith(prefix) for s in env.seen)


class NotedEnv(ToolLoopEnv):
    def note_response(self, tokens, truncated, prompt_tokens=0):
        self.notes = getattr(self, "notes", []) + [(tokens, truncated, prompt_tokens)]


def test_response_prefix_in_loss_trains_the_prefix_as_marss_mask_does(tiny_llm):
    """``response_prefix_in_loss``: the same tokens in the same order (greedy: the same episodes), but the prefix
    opens each turn's response and is in the loss mask, as MARS's mask covers ``"<think>\\n" + text`` re-tokenized
    in the assistant message; forced tokens carry sampler log-prob 0; the env reads and is told the same."""
    prefix = "<think>\n"
    prefix_ids = tiny_llm.tokenizer.encode(prefix, add_special_tokens=False)

    def run(in_loss):
        cfg = RolloutConfig(max_tokens_per_turn=5, max_turns=10, temperature=0.0, response_prefix=prefix)
        cfg.response_prefix_in_loss = in_loss
        envs = []
        trajs = RolloutEngine(tiny_llm, cfg).run(specs(lambda: envs.append(NotedEnv(2)) or envs[-1], 2)).trajectories
        return trajs, envs

    (plain, plain_envs), (trained, trained_envs) = run(False), run(True)
    n = len(prefix_ids)
    for p, t in zip(plain, trained):
        ps, ts = p.to_sequence(), t.to_sequence()
        assert ts.input_ids == ps.input_ids  # what the model saw is unchanged
        expected_mask = [0] * len(ps.input_ids)
        for turn in p.turns:  # MARS's mask: from the prefix's first token to the response's last
            start = len(turn.prompt_ids) - n
            expected_mask[start : len(turn.prompt_ids) + len(turn.response_ids)] = [1] * (n + len(turn.response_ids))
        assert ts.loss_mask == expected_mask and ts.loss_mask != ps.loss_mask
        for pt, tt in zip(p.turns, t.turns):
            assert tt.prompt_ids == pt.prompt_ids[:-n] and tt.response_ids == prefix_ids + pt.response_ids
            assert tt.response_logprobs == pytest.approx([0.0] * n + pt.response_logprobs)
            assert len(tt.response_versions) == len(tt.response_ids) and tt.text == pt.text
    for pe, te in zip(plain_envs, trained_envs):
        assert te.seen == pe.seen and te.notes == pe.notes  # generated tokens and the prompt the model was given


def test_env_is_told_each_responses_token_count_and_cut(tiny_llm):
    envs = []
    cfg = RolloutConfig(max_tokens_per_turn=3, max_turns=10, temperature=1.0)
    trajs = RolloutEngine(tiny_llm, cfg).run(specs(lambda: envs.append(NotedEnv(3)) or envs[-1], 4)).trajectories
    for traj, env in zip(trajs, envs):
        assert env.notes == [(len(t.response_ids), t.finish_reason == "length", len(t.prompt_ids)) for t in traj.turns]
    assert any(cut for env in envs for _, cut, _ in env.notes)


def test_multi_agent_rewards_go_to_each_seat(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=4))
    result = engine.run(specs(TwoSeatEnv, 2), seed=1)
    by_seat = {(t.group_id, t.agent): t for t in result.trajectories}
    assert len(by_seat) == 4
    for g in ("0", "1"):
        p0, p1 = by_seat[(g, "p0")], by_seat[(g, "p1")]
        assert len(p0.turns) == 2 and len(p1.turns) == 2
        # p1 moved last (t=4): +1 on its last turn; p0's last turn -1; each earlier turn +0.05
        assert [t.reward for t in p1.turns] == pytest.approx([0.05, 1.0])
        assert [t.reward for t in p0.turns] == pytest.approx([0.05, 0.05 - 1.0])
        p0.to_sequence(), p1.to_sequence()  # each seat's conversation extends itself token-exactly


def test_max_turns_truncates_and_keeps(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=4, max_turns=2))
    trajs = engine.run(specs(lambda: ToolLoopEnv(10), 2), seed=0).trajectories
    assert all(t.truncated and t.limit == "max_turns" and len(t.turns) == 2 and not t.terminated for t in trajs)


def test_context_limit_cuts_and_truncates(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=8, max_context_tokens=60))
    result = engine.run(specs(lambda: ToolLoopEnv(10), 2), seed=0)
    for t in result.trajectories:
        assert t.truncated and t.limit == "context"
        seq = t.to_sequence()
        assert len(seq.input_ids) <= 60
        assert t.turns, "the turns before the limit are kept"


def test_context_limit_never_exceeds_the_model(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_context_tokens=10**9))
    assert engine.max_context == tiny_llm.context_length


def test_max_tokens_marks_truncated_but_env_still_scores(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=1, temperature=1.0))
    trajs = engine.run(specs(lambda: TaskEnv(), 4), seed=0).trajectories
    cut = [t for t in trajs if t.turns[0].finish_reason == "length"]
    assert cut and all(t.truncated and t.limit == "max_tokens" and t.terminated for t in cut)


def test_env_failure_is_kept_and_counted(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(max_tokens_per_turn=4))
    make = [lambda: ToolLoopEnv(3, fail_at=2), lambda: ToolLoopEnv(3)]
    result = engine.run([EpisodeSpec(m, seed=i, group_id=str(i)) for i, m in enumerate(make)], seed=0)
    bad, good = result.trajectories
    assert bad.failed and "tool backend exploded" in bad.error and len(bad.turns) == 2
    assert not good.failed and good.terminated and len(good.turns) == 3
    assert result.stats["failed"] == 1


def test_seed_makes_rollouts_reproducible(tiny_llm):
    engine = RolloutEngine(tiny_llm, RolloutConfig(group_size=3, max_tokens_per_turn=6))
    tasks = specs(lambda: ToolLoopEnv(2), 2)
    ids = lambda r: [[turn.response_ids for turn in t.turns] for t in r.trajectories]  # noqa: E731
    a, b, c = engine.run(tasks, seed=7), engine.run(tasks, seed=7), engine.run(tasks, seed=8)
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert [t.group_id for t in a.trajectories] == ["0", "0", "0", "1", "1", "1"]


def test_group_first_turn_uses_n_samples():
    p, q = [1, 2], [3]
    assert uniform_run_length([p, p, q, q]) == 2
    assert uniform_run_length([p, p, p]) == 3
    assert uniform_run_length([p, q, q]) == 1
    assert uniform_run_length([p, p, p, p]) == 4
    assert uniform_run_length([p, p, q]) == 1


def test_task_env_and_builtin_reward():
    samples = next_number(num_samples=10)
    assert all(0 <= int(s["answer"]) <= 9 for s in samples)
    env = TaskEnv()
    env.reset(seed=1)
    answer = env.sample["answer"]
    assert env.step(f" {answer} ").rewards == {"agent": 1.0}
    assert env.step(f"{answer}0").rewards == {"agent": 0.0}
