"""egpo's BFCL evaluation is the shared trainer's eval hook: BFCL once, at the end of training, on the saved policy."""

from __future__ import annotations

from types import SimpleNamespace

from palaestra.shared.jobs import load_config


def test_bfcl_runs_at_the_last_step_only(tmp_path, monkeypatch):
    import palaestra.egpo.eval as egpo_eval
    from palaestra.egpo.train import BfclAtEnd

    calls = []

    def fake_evaluate(eval_cfg, client, tracker, rollouts=None):
        calls.append((eval_cfg.llm.model, list(eval_cfg.categories), client, rollouts))
        return {"bfcl/simple_python/accuracy": 0.5, "headline": "BFCL accuracy 50%"}

    monkeypatch.setattr(egpo_eval, "evaluate_with_client", fake_evaluate)
    cfg = load_config({"job": "egpo.train"}, [f"output_dir={tmp_path}", "steps=3", "eval.categories=[simple_python]"])
    (tmp_path / "checkpoints" / "step_000003").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_000003" / "trainer_state.pt").touch()  # what marks a finished checkpoint
    trainer = SimpleNamespace(
        total_steps=3,
        ckpt_dir=tmp_path / "checkpoints",
        client="the trained client",
        eval_rollouts=lambda: "the training rollouts",  # its workers, holding the synced weights (issue 23)
    )
    hook = BfclAtEnd(cfg, tracker=None)
    assert hook(trainer, 0) == {} and hook(trainer, 2) == {} and not calls  # before and during: nothing
    assert hook(trainer, 3) == {"bfcl/simple_python/accuracy": 0.5}  # the numbers go to the trainer's summary
    checkpoint = str(tmp_path / "checkpoints" / "step_000003")
    assert calls == [(checkpoint, ["simple_python"], "the trained client", "the training rollouts")]
    assert hook.result["headline"] == "BFCL accuracy 50%"  # the job returns the whole result
