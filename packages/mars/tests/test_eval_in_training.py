"""MARS's evaluation inside training (issue 23, defect 3): its games play on the trainer's rollouts with the
training sampling (top_p, top_k, the forced response prefix), context and turn limits unless ``eval`` sets them,
and a game cut by a limit is reported as truncated, not as a loss."""

import pytest

from palaestra.mars.engine_eval import engine_episodes
from palaestra.mars.game_stats import summarize
from palaestra.mars.players import Player, RandomPlayer
from palaestra.mars.scripted_llm import ScriptedLegalClient
from palaestra.mars.train import MarsTrainConfig, _eval_config
from palaestra.shared.jobs import load_config, run_job
from palaestra.shared.rollout.engine import RolloutConfig
from palaestra.shared.rollout.workers import LocalRollouts

# MARS's training sampling (qwen3_4b.yaml's rollout)
PAPER_ROLLOUT = RolloutConfig(
    group_size=8,
    max_turns=40,
    max_tokens_per_turn=4096,
    max_context_tokens=32768,
    temperature=0.6,
    top_p=0.99,
    top_k=100,
    stop=["</answer>"],
    response_prefix="<think>\n",
)


def test_the_eval_hook_samples_as_training_unless_eval_says_otherwise():
    ev = _eval_config(MarsTrainConfig(rollout=PAPER_ROLLOUT))
    assert (ev.temperature, ev.top_p, ev.top_k, ev.response_prefix) == (0.6, 0.99, 100, "<think>\n")
    assert (ev.max_tokens, ev.max_context_tokens, ev.max_turns, ev.stop) == (4096, 32768, 40, ["</answer>"])
    cfg = load_config(
        {"job": "mars.train", "rollout": {"top_p": 0.99, "top_k": 100, "max_context_tokens": 32768}},
        ["eval.top_k=5"],
    )
    ev = _eval_config(cfg)
    assert (ev.top_p, ev.top_k, ev.max_context_tokens) == (0.99, 5, 32768)


def test_the_in_training_eval_plays_on_the_trainers_rollouts(tracking, tmp_path, monkeypatch):
    runs = []
    run = LocalRollouts.run

    def recording_run(self, specs, seed, cfg=None):
        runs.append((self, cfg, len(specs)))
        return run(self, specs, seed, cfg)

    monkeypatch.setattr(LocalRollouts, "run", recording_run)
    rollout = {
        "group_size": 2,
        "max_turns": 9,
        "max_tokens_per_turn": 6,
        "max_context_tokens": 700,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 7,
        "stop": ["</answer>"],
        "response_prefix": "<think>\n",
    }
    cfg = load_config(
        {
            "job": "mars.train",
            "llm": {"model": "tiny"},
            "output_dir": str(tmp_path),
            "games": [{"game": "tic_tac_toe"}],
            "prompt": "compact",
            "rollout": rollout,
            "steps": 0,
            "eval": {"games": ["tic_tac_toe"], "opponents": ["random"], "seats": ["first"], "episodes": 2},
            "tracking": {"uri": tracking.uri, "artifact_root": tracking.artifact_root, "experiment": "test"},
        }
    )
    out = run_job(cfg)
    evals = [(owner, run_cfg, n) for owner, run_cfg, n in runs if run_cfg is not None]
    assert evals, "the evaluation did not play on the trainer's rollouts"
    for owner, run_cfg, n in evals:
        assert owner.engine.cfg.group_size == 2  # the trainer's rollouts (built with the training settings)
        assert n == 2 and run_cfg.group_size == 1  # one game per evaluation seed
        assert {k: getattr(run_cfg, k) for k in rollout if k != "group_size"} == {
            k: v for k, v in rollout.items() if k != "group_size"
        }
    assert len({id(owner) for owner, _, _ in evals}) == 1
    import mlflow

    metrics = mlflow.tracking.MlflowClient(tracking.uri).get_run(out["run_id"]).data.metrics
    assert "eval/tic_tac_toe/first/random/truncated_rate" in metrics


class RaisingPlayer(Player):
    def act(self, env):
        raise RuntimeError("opponent broke")


def test_games_cut_by_the_context_are_truncated_not_lost():
    client = ScriptedLegalClient(seed=0)
    seeds = list(range(5))
    cut = RolloutConfig(max_turns=50, max_tokens_per_turn=32, max_context_tokens=20)  # under any prompt's length
    results, stats = engine_episodes(client, cut, "tic_tac_toe", seeds, 0, RandomPlayer(3), prompt="compact")
    assert stats["truncated"] == 5 and all(r.truncated and not r.failed for r in results)
    summary = summarize(results, 0)
    assert summary["truncated_rate"] == 1.0 and summary["failed_rate"] == 0.0
    assert summary["loss_rate"] == summary["win_rate"] == summary["format_loss_rate"] == 0.0
    assert summary["mean_return"] == 0.0
    # an env that raises (here its opponent, moving first) is a failed game: neither a loss nor truncated
    room = RolloutConfig(max_turns=50, max_tokens_per_turn=32, max_context_tokens=4096)
    results, stats = engine_episodes(client, room, "tic_tac_toe", seeds, 1, RaisingPlayer(), prompt="compact")
    assert stats["failed_episodes"] == 5
    summary = summarize(results, 1)
    assert summary["failed_rate"] == 1.0 and summary["truncated_rate"] == summary["loss_rate"] == 0.0
    # the same games with room to finish: each has a result, none truncated
    results, _ = engine_episodes(client, room, "tic_tac_toe", seeds, 0, RandomPlayer(3), prompt="compact")
    summary = summarize(results, 0)
    assert summary["truncated_rate"] == 0.0
    assert summary["win_rate"] + summary["draw_rate"] + summary["loss_rate"] == pytest.approx(1.0)


def test_an_mcts_opponent_travels_to_a_rollout_worker_and_plays_the_same_games():
    """The trainer's evaluation on Ray workers pickles each env with its opponent; OpenSpiel's MCTS bot does not
    pickle, so the player rebuilds it from its settings: the games are those of the player that stayed here."""
    import pickle

    from palaestra.mars.games import make_game
    from palaestra.mars.players import MCTSPlayer

    room = RolloutConfig(max_turns=50, max_tokens_per_turn=64, max_context_tokens=1 << 20, stop=["</answer>"])
    here = MCTSPlayer(make_game("tic_tac_toe"), 2.0, 20, 2, seed=5)
    travelled = pickle.loads(pickle.dumps(here))
    assert travelled.bot is not here.bot and travelled.max_simulations == 20

    def games(opponent):
        results, _ = engine_episodes(
            ScriptedLegalClient(seed=1), room, "tic_tac_toe", list(range(4)), 0, opponent, prompt="compact"
        )
        return [(r.returns, r.winner, r.turns) for r in results]

    assert games(travelled) == games(here)


def test_a_checkpoint_opponent_samples_as_the_policy_does(tiny_llm):
    """A frozen LLM opponent (``opponents: [checkpoint]``) gets the evaluation's top_p, top_k and forced prefix."""
    from palaestra.mars.eval import GameEvalConfig, make_player
    from palaestra.mars.games import make_game

    class Recording:
        def __init__(self, client):
            self.client, self.tokenizer, self.asked = client, client.tokenizer, []

        def render(self, messages, tools=None, add_generation_prompt=True):
            return self.client.render(messages, tools, add_generation_prompt)

        def generate(self, prompts, params):
            self.asked.append((prompts, params))
            return self.client.generate(prompts, params)

        def chat(self, conversations, params):
            return self.generate([self.render(c) for c in conversations], params)

    cfg = GameEvalConfig(temperature=0.6, top_p=0.9, top_k=7, response_prefix="<think>\n", max_tokens=5)
    recording = Recording(tiny_llm)
    player = make_player(
        "checkpoint", cfg, make_game("tic_tac_toe"), cfg.opponent_llm, {repr(cfg.opponent_llm): recording}
    )
    conversation = [{"role": "user", "content": "GAME STATE: ..."}]
    [text] = player.act_batch([conversation])
    [(prompts, params)] = recording.asked
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.9, 7, 5)
    prefix = tiny_llm.tokenizer.encode("<think>\n", add_special_tokens=False)
    assert prompts == [tiny_llm.render(conversation) + prefix]
    assert text.startswith("<think>\n")  # what the env reads: the prefix and what was sampled after it
