"""Training on the template's view (``rollout.context=template``): each turn on the prompt it was sampled on.

Under Qwen3's original template (read from the installed TRL at test time) a re-rendered conversation drops the
earlier answers' ``<think>``, so no later prompt extends the one before. The oracle is independent of the engine
and the batch: every turn's prompt is the whole conversation rendered by ``apply_chat_template``, and every
training row is that render followed by the turn's response, its mask on the response alone. The batch's
per-token advantages, sampler log-probs and per-trajectory think entropy are checked against sums written out
here. The negative control: the generated view's one-sequence rule refuses these trajectories.
"""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest
import torch

from palaestra.shared.llm.base import Completion, LLMClient
from palaestra.shared.rl.async_rollouts import behaviour_tensors
from palaestra.shared.rl.batch import build_batch, think_entropy, token_advantages
from palaestra.shared.rollout.chat_tokens import ContextView
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.testing import TakeTurns

pytest.importorskip("trl")

THOUGHT = "<think>\nweigh {k}\n</think>\n\nplay {k}"


def qwen3(tiny_llm):
    import copy

    tok = copy.deepcopy(tiny_llm.tokenizer)
    template = (importlib.resources.files("trl") / "chat_templates" / "qwen3.jinja").read_text()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]})
    tok.chat_template = template
    return tok


class Thinker(LLMClient):
    """Answers ``THOUGHT`` for its k-th turn and stops on ``<|im_end|>``; log-prob -(k+1)/10 on every token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, params=None):
        out = []
        for prompt in prompts:
            k = self.tokenizer.decode(prompt).count("<|im_start|>assistant") - 1
            text = THOUGHT.format(k=k)
            ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
            for _ in range(params.n if params else 1):  # the engine asks once for a prompt repeated n times
                out.append(Completion(text, ids, [-(k + 1) / 10] * len(ids), list(prompt), "stop"))
        return out


def play(tok, view: ContextView):
    cfg = RolloutConfig(max_turns=8, context=view)
    specs = [EpisodeSpec(TakeTurns, seed=i, group_id=str(i)) for i in range(2)]
    result = RolloutEngine(Thinker(tok), cfg).run(specs)
    assert not any(t.failed for t in result.trajectories)
    return result.trajectories


def oracle_prompt(tok, agent: str, k: int) -> list[int]:
    """The whole conversation of `agent` before its turn k, rendered by the template."""
    seat = TakeTurns.agents.index(agent)
    history: list[dict] = []
    for j in range(k + 1):
        history.append({"role": "user", "content": f"move {seat + 2 * j}"})
        if j < k:
            history.append({"role": "assistant", "content": THOUGHT.format(k=j)})
    text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_each_turn_trains_on_the_whole_render_it_was_sampled_on(tiny_llm):
    tok = qwen3(tiny_llm)
    trajs = play(tok, ContextView.template)
    for traj in trajs:
        rows = traj.to_sequences(split=True)
        assert len(rows) == len(traj.turns) == 2  # no re-render extends the last: a row per turn
        for k, (row, turn) in enumerate(zip(rows, traj.turns)):
            prompt = oracle_prompt(tok, traj.agent, k)
            assert row.input_ids == prompt + turn.response_ids
            assert row.loss_mask == [0] * len(prompt) + [1] * len(turn.response_ids)
            assert set(row.turn_index[len(prompt) :]) == {k}
        assert tok.decode(rows[1].input_ids).count("weigh") == 1  # turn 0's <think> is not in turn 1's row
        with pytest.raises(ValueError, match="does not extend"):  # the negative control: one sequence refused
            traj.to_sequence()


def test_the_generated_view_keeps_one_row_per_conversation(tiny_llm):
    tok = qwen3(tiny_llm)
    for traj in play(tok, ContextView.generated):
        (row,) = traj.to_sequences(split=True)  # every prompt extends: one row, whichever way it is cut
        assert row == traj.to_sequence()
        assert tok.decode(row.input_ids).count("weigh") == 2  # the earlier <think> kept


def test_the_batch_maps_rows_back_to_their_trajectories(tiny_llm):
    tok = qwen3(tiny_llm)
    trajs = play(tok, ContextView.template)
    think = (tok.convert_tokens_to_ids("<think>"), tok.convert_tokens_to_ids("</think>"))
    batch = build_batch(trajs, tok.pad_token_id or 0, think, split=True)
    assert batch.trajectory.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    values = [np.array([10.0 * i + 1, 10.0 * i + 2]) for i in range(len(trajs))]
    adv = token_advantages(values, batch)
    logps, _ = behaviour_tensors(trajs, tuple(batch.loss_mask.shape), split=True)
    for row in range(len(batch)):
        i, on = int(batch.trajectory[row]), batch.loss_mask[row] > 0
        k = row % 2
        assert torch.all(adv[row, on] == 10.0 * i + k + 1) and torch.all(adv[row, ~on] == 0)
        assert torch.allclose(logps[row, on], torch.tensor(-(k + 1) / 10))
    # think entropy per trajectory: the token mean over all its rows' think spans (row r's tokens at r + 1)
    entropy = (torch.arange(len(batch), dtype=torch.float32) + 1)[:, None].expand_as(batch.loss_mask)
    got = think_entropy(entropy.contiguous(), batch)
    for i in range(len(trajs)):
        rows = (batch.trajectory == i).nonzero().flatten().tolist()
        counts = [int(batch.think_mask[r].sum()) for r in rows]
        assert all(counts)  # "weigh k" inside <think> in every row
        want = sum((r + 1) * c for r, c in zip(rows, counts)) / sum(counts)
        assert got[i] == pytest.approx(want)


def test_a_trainer_step_on_the_template_view_and_its_evaluation_tag(tmp_path, monkeypatch):
    from palaestra.shared.rl.config import EnvSpec
    from palaestra.shared.rl.trainer import Trainer
    from palaestra.shared.testing import small_train_config

    cfg = small_train_config(
        tmp_path,
        "exact_answer",
        envs=[EnvSpec("solver_critic", {"source": "next_number", "rounds": 2})],
        rollout=RolloutConfig(group_size=2, max_tokens_per_turn=5, context=ContextView.template),
        steps=1,
        eval_tasks=1,
        eval_before=False,
    )
    assert cfg.eval.context == ContextView.template  # inherited from the rollout
    tags: dict = {}
    built: list = []
    from palaestra.shared.rl import trainer as trainer_module

    def recording(trajs, *args):
        built.append((len(trajs), batch := build_batch(trajs, *args)))
        return batch

    monkeypatch.setattr(trainer_module, "build_batch", recording)
    with Trainer(cfg) as trainer:
        monkeypatch.setattr(trainer.tracker, "set_tags", lambda t: tags.update(t))
        metrics = trainer.train_step()
        trainer.evaluate()
    assert np.isfinite(metrics["train/loss"])
    ((trajectories, batch),) = built
    assert len(batch) > trajectories and batch.trajectory.unique().numel() == trajectories  # split rows trained
    assert tags["palaestra.eval_context"] == "template"
