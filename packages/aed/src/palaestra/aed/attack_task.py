"""One accident type's attack, as a Ray task: reward design, training, evaluation, preference fine-tuning, video.

`attack_task` runs inside a Ray worker and logs into its own MLflow child run
(created by the driver with ``Tracker.child_run_id``, joined here with
``Tracker.attach``). It returns a JSON-able summary; the driver aggregates.
The random-adversary baseline is the same task with ``kind="random"``, the
passive one (adversaries always IDLE: the victim's own accidents) ``kind="passive"``.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from palaestra.shared.tracking import Tracker, scratch_dir


def attack_task(task: dict[str, Any]) -> dict[str, Any]:
    from palaestra.shared.jobs import seed_everything

    cfg, scenario, kind = task["cfg"], task["scenario"], task["kind"]
    _test_faults(task.get("test_faults") or {}, task)
    seed_everything(cfg.seed)
    import torch

    torch.set_num_threads(1)
    with Tracker.attach(cfg.tracking, task.get("run_id")) as tracker:
        arm = task.get("arm")
        rewards = "llm" if arm == "proposed" else arm or cfg.rewards  # a proposed type has no expert reward
        sandboxed = bool(task.get("taxonomy")) or (kind == "attack" and rewards == "llm")
        isolation = _log_isolation(tracker) if sandboxed else None
        if kind in ("random", "passive"):
            out = _baseline(cfg, scenario, kind, tracker, task.get("taxonomy"))
        else:
            out = _attack_type(cfg, scenario, task["accident_type"], tracker, task.get("taxonomy"), rewards)
        out["arm"] = arm
        return {**out, "sandbox_isolation": isolation} if isolation is not None else out


def _log_isolation(tracker: Tracker) -> dict[str, Any]:
    """The sandbox isolation on this worker, as tags of the run (``aed.sandbox.<layer>``); a missing layer is
    a loud warning (`sandbox.report_isolation`) and the tag ``aed.sandbox.missing``."""
    from palaestra.aed.sandbox import probe_isolation, report_isolation

    isolation = probe_isolation()
    missing = report_isolation(isolation, "aed sandbox")
    tracker.set_tags({f"aed.sandbox.{k}": str(v) for k, v in isolation.items()})
    tracker.set_tags({"aed.sandbox.missing": ",".join(missing) or "none"})
    if missing:
        print(f"[aed] WARNING: sandbox isolation layers missing on this worker: {', '.join(missing)}")
    return isolation


def victim_checkpoint(cfg, scenario: str) -> str | None:
    """The RL victim of `scenario`: ``victim_checkpoint`` with ``{scenario}`` replaced (one victim per scenario)."""
    return cfg.victim_checkpoint.replace("{scenario}", scenario) if cfg.victim_checkpoint else None


def adversary_spec(cfg, scenario: str, accident_type: str, taxonomy: list[dict] | None = None):
    from palaestra.aed.adversary import AdversarySpec

    return AdversarySpec(
        scenario=scenario,
        accident_type=accident_type,
        victim=cfg.victim,
        victim_checkpoint=victim_checkpoint(cfg, scenario),
        num_adversaries=cfg.num_adversaries,
        overrides=dict(cfg.env_overrides),
        max_steps=cfg.max_steps,
        placement=str(cfg.adversary_placement),
        taxonomy=taxonomy,
    )


def _baseline(cfg, scenario: str, kind: str, tracker: Tracker, taxonomy=None) -> dict[str, Any]:
    from palaestra.aed.evaluation import IdlePolicy, evaluate

    spec = adversary_spec(cfg, scenario, "rear_end", taxonomy)  # the reward plays no part in a baseline
    policy = IdlePolicy(cfg.num_adversaries) if kind == "passive" else None
    ev = evaluate(policy, spec, cfg.eval_episodes, seed=cfg.seed + 50_000)
    tracker.log_metrics({f"aed/{scenario}/{kind}/{k}": ev[k] for k in ("asr", "responsible_rate", "effective_asr")})
    return {"kind": kind, "scenario": scenario, **{k: v for k, v in ev.items() if k != "accidents"}}


def _attack_type(
    cfg, scenario: str, accident_type: str, tracker: Tracker, taxonomy=None, rewards: str = "expert"
) -> dict[str, Any]:
    from palaestra.aed.adversary import build_model, train_adversary
    from palaestra.aed.evaluation import evaluate, record_gif
    from palaestra.aed.rewards import EXPERT_REWARDS, generic_reward, register_reward

    prefix = f"aed/{scenario}/{accident_type}"
    log = lambda metrics, step: tracker.log_metrics({f"{prefix}/{k}": v for k, v in metrics.items()}, step)
    spec = adversary_spec(cfg, scenario, accident_type, taxonomy)
    has_expert = accident_type in EXPERT_REWARDS
    out: dict[str, Any] = {
        "kind": "attack",
        "scenario": scenario,
        "accident_type": accident_type,
        "reward_source": "expert" if has_expert else "generic",
    }
    if rewards == "llm" or not has_expert:  # a type without an expert reward runs on its LLM reward alone
        out.update(_design(cfg, spec, tracker, log))
        if out["reward_source"] == "llm":
            spec = replace(spec, reward_code=out["reward_code"])
        elif not has_expert:
            out["reward_source"] = "generic_fallback"
    fallback = EXPERT_REWARDS.get(accident_type) or generic_reward(accident_type)
    code = spec.reward_code or inspect.getsource(fallback)
    tracker.log_text(code, f"reward/{accident_type}.py")
    if spec.reward_code:
        from palaestra.aed.sandbox import LazySandboxedReward

        name = register_reward(f"aed/llm/{scenario}/{accident_type}", LazySandboxedReward(spec.reward_code))
        out["registered_reward"] = name

    model = build_model(spec, cfg.train, cfg.seed)
    stats = train_adversary(model, cfg.train.timesteps, log=log, log_every=cfg.log_every, target=accident_type)
    model.get_env().close()
    policy = scratch_dir() / f"adversary_{scenario}_{accident_type}.zip"
    model.save(str(policy))
    tracker.log_artifact(policy, "policies")
    ev = evaluate(model, spec, cfg.eval_episodes, seed=cfg.seed + 50_000)
    out.update(train={k: v for k, v in stats.items() if k not in ("accident_log", "accident_slots")})
    out["steps_to_first_success"] = stats["steps_to_first_success"]
    out.update({k: v for k, v in ev.items() if k != "accidents"})
    out["accident_features"] = [a["features"] for a in ev["accidents"]]
    if stats["reward_errors"]:
        out["reward_errors"] = stats["reward_errors"]
        print(
            f"[aed] {prefix}: reward failed during training ({stats['reward_errors'][0]}); fell back to expert reward"
        )
    out.update(reward_provenance(out["reward_source"], stats))
    metrics: dict[str, float] = {"steps_to_first_success": stats["steps_to_first_success"] or -1}
    for key in ("asr", "target_rate", "responsible_rate", "effective_asr"):
        metrics[key] = ev[key]
        metrics[f"{key}_lo"], metrics[f"{key}_hi"] = ev[f"{key}_ci"]
    if cfg.preference.enabled:
        pref = _preference(cfg, spec, model, stats, ev, tracker)
        out["preference"] = pref
        metrics.update({f"preference/{k}": v for k, v in pref.items() if isinstance(v, int | float)})
    log(metrics, cfg.train.timesteps)
    tracker.log_dict({"spec": asdict(spec), "accidents": ev["accidents"]}, f"accidents/{accident_type}.json")
    if cfg.video:
        gif = scratch_dir() / f"{scenario}_{accident_type}.gif"
        shown = record_gif(model, spec, gif, seed=cfg.seed + 60_000, max_episodes=cfg.video_episodes)
        tracker.log_artifact(gif, "videos")
        out["video_accident"] = bool(shown["victim_collision"])
        out["video_shows"] = shown["shows"]
        tracker.set_tags({"aed.video": f"{shown['shows']} ({shown['accident_type'] or 'no accident'})"})
        if shown["shows"] != "target":
            print(
                f"[aed] {prefix}: no {accident_type} accident in {cfg.video_episodes} video episodes ({shown['shows']})"
            )
    return out


def reward_provenance(source: str, stats: dict[str, Any]) -> dict[str, Any]:
    """``reward_source`` after training: an LLM reward that failed mid-training (the env switched to the expert
    reward) is ``llm_dropped``, with the timestep of the switch."""
    if source == "llm" and stats["reward_dropped_at"] is not None:
        return {"reward_source": "llm_dropped", "reward_dropped_at": stats["reward_dropped_at"]}
    return {"reward_source": source}


def _design(cfg, spec, tracker: Tracker, log) -> dict[str, Any]:
    from palaestra.aed.eureka import design_reward
    from palaestra.shared.llm import make_client

    settings = replace(cfg.train, timesteps=cfg.eureka.timesteps)
    on_sample = sample_logger(spec, tracker)
    try:
        client = make_client(cfg.llm)
        result = design_reward(
            client,
            spec,
            settings,
            rounds=cfg.eureka.rounds,
            samples=cfg.eureka.samples,
            eval_episodes=cfg.eureka.eval_episodes,
            seed=cfg.seed,
            temperature=cfg.eureka.temperature,
            max_tokens=cfg.eureka.max_tokens,
            log=log,
            on_sample=on_sample,
        )
    except Exception as err:  # an unreachable LLM is a failed design, not a failed run
        result = {"code": None, "fallback": True, "history": [], "reason": f"LLM reward design failed: {err}"}
    tracker.log_dict(result["history"], f"eureka/{spec.accident_type}_history.json")
    if result["history"]:
        from palaestra.aed.report import design_figure

        title = f"{spec.scenario}/{spec.accident_type}: reward design"
        tracker.log_figure(design_figure(result["history"], title), f"{spec.accident_type}_reward_design")
    if result["fallback"]:
        print(f"[aed] {spec.scenario}/{spec.accident_type}: {result['reason']}; falling back to the expert reward")
        tracker.set_tags({f"aed.{spec.accident_type}.reward": "expert (LLM fallback)"})
        return {"reward_source": "expert_fallback", "fallback_reason": result["reason"]}
    tracker.set_tags({f"aed.{spec.accident_type}.reward": f"llm round {result['round'] + 1}"})
    return {"reward_source": "llm", "reward_code": result["code"], "eureka_fitness": result["fitness"]}


def sample_logger(spec, tracker: Tracker):
    """Each Eureka candidate as it is decided: a line of ``eureka/<type>_samples.jsonl`` (re-logged every time, so
    a run stopped midway keeps what it drew), and in MLflow ``.../eureka/sample_outcome`` (its index in
    `eureka.OUTCOMES`) and ``.../eureka/sample_fitness`` (-1 unless trained) at step = its number in the run, and
    the tag ``aed.eureka.<scenario>.<type>.r<round>s<sample>`` with its outcome and reason or score."""
    import json

    from palaestra.aed.eureka import OUTCOMES, describe_outcome, sample_record

    path = scratch_dir() / f"{spec.scenario}_{spec.accident_type}_samples.jsonl"
    prefix, count = f"aed/{spec.scenario}/{spec.accident_type}/eureka", [0]

    def on_sample(entry: dict[str, Any]) -> None:
        with path.open("a") as out:
            out.write(json.dumps(sample_record(entry)) + "\n")
        tracker.log_artifact(path, "eureka")
        metrics = {"sample_outcome": OUTCOMES.index(entry["outcome"]), "sample_fitness": entry["fitness"]}
        tracker.log_metrics({f"{prefix}/{k}": float(v) for k, v in metrics.items()}, count[0])
        where = f"aed.eureka.{spec.scenario}.{spec.accident_type}.r{entry['round'] + 1}s{entry['sample'] + 1}"
        tracker.set_tags({where: describe_outcome(entry)[:500]})
        count[0] += 1

    return on_sample


def _preference(cfg, spec, model, stats, ev_before, tracker: Tracker) -> dict[str, Any]:
    """Fit the Bradley-Terry model on judge-compared pairs of accidents (held-out pair accuracy reported),
    fine-tune with it, evaluate again."""
    from palaestra.aed.adversary import adversary_vec_env, restart_exploration, train_adversary
    from palaestra.aed.evaluation import evaluate
    from palaestra.aed.judge import rule_breakdown
    from palaestra.aed.preference import PreferenceModel, compare_pairs, label_accidents, relabel_replay, split_pairs

    accidents = stats["accident_log"] + ev_before["accidents"]
    judge = None
    if cfg.preference.judge == "llm":
        from palaestra.aed.judge import LLMJudge
        from palaestra.shared.llm import make_client

        judge = LLMJudge(make_client(cfg.llm), max_tokens=cfg.preference.judge_max_tokens)
    labels = label_accidents(accidents, judge)
    n_pos = sum(labels)
    base = {
        "accidents": len(accidents),
        "responsible_labels": n_pos,
        "responsible_rate_before": ev_before["responsible_rate"],
        "asr_before": ev_before["asr"],
    }
    if n_pos == 0 or n_pos == len(labels) or len(accidents) < cfg.preference.min_accidents:
        print(
            f"[aed] preference learning skipped for {spec.accident_type}: "
            f"{n_pos}/{len(accidents)} accidents the victim is responsible for"
        )
        return {**base, "skipped": 1}
    features = [a["features"] for a in accidents]
    pairs = compare_pairs(accidents, judge, max_pairs=cfg.preference.max_pairs, seed=cfg.seed)
    train_idx, train_pairs, test_pairs = split_pairs(len(accidents), pairs, cfg.preference.holdout, cfg.seed)
    if not train_pairs:
        print(f"[aed] preference learning skipped for {spec.accident_type}: no judged pair among training accidents")
        return {**base, "skipped": 1}
    pm = PreferenceModel(len(features[0]), seed=cfg.seed)
    fit = pm.fit(features, train_pairs, epochs=cfg.preference.epochs)
    fit["heldout_pairs"] = len(test_pairs)
    fit["heldout_pair_accuracy"] = pm.pair_accuracy(features, test_pairs) if test_pairs else -1.0
    fit["label_accuracy"] = pm.calibrate([features[i] for i in train_idx], [labels[i] for i in train_idx])
    tuned = replace(
        spec,
        preference_model=pm.to_dict(),
        effective_bonus=cfg.preference.effective_bonus,
        ineffective_penalty=cfg.preference.ineffective_penalty,
        responsibility_shaping=cfg.preference.responsibility_shaping,
    )
    model.set_env(adversary_vec_env(tuned, cfg.train.n_envs, cfg.seed + 1))
    restart = cfg.preference.restart_exploration > 0
    if restart:
        restart_exploration(model, cfg.preference.restart_exploration)
    relabelled = {}
    if cfg.preference.relabel_buffer:
        relabelled = relabel_replay(
            model,
            stats["accident_log"],
            stats["accident_slots"],
            pm.is_effective,
            cfg.preference.effective_bonus,
            cfg.preference.ineffective_penalty,
        )
    tuned_stats = train_adversary(model, cfg.preference.finetune_timesteps, restart=restart)
    model.get_env().close()
    after = evaluate(model, tuned, cfg.eval_episodes, seed=cfg.seed + 50_000)
    tracker.log_dict(pm.to_dict(), f"preference/{spec.accident_type}_bt_model.json")
    # which judge rule decided each evaluation accident, before and after: what the fine-tuning changed
    rules = {"before": rule_breakdown(ev_before["accidents"]), "after": rule_breakdown(after["accidents"])}
    tracker.log_dict(rules, f"preference/{spec.accident_type}_rules.json")
    out = {
        **base,
        **fit,
        **relabelled,
        "rules": rules,
        "finetune_accidents": tuned_stats["accidents"],
        "finetune_responsible": tuned_stats["responsible"],
    }
    for name, ev in (("before", ev_before), ("after", after)):
        for key in ("responsible_rate", "asr", "effective_asr"):
            out[f"{key}_{name}"] = ev[key]
            out[f"{key}_{name}_lo"], out[f"{key}_{name}_hi"] = ev[f"{key}_ci"]
    return out


def _test_faults(faults: dict, task: dict) -> None:
    """Fault injection, set by the tests on the task (never in a config): ``fail_types`` (accident types whose task
    raises) and ``crash_once_dir`` (each task kills its worker once, leaving a marker there: Ray retries it)."""
    if task.get("accident_type") in faults.get("fail_types", ()):
        raise RuntimeError(f"injected failure for accident type {task['accident_type']}")
    if faults.get("crash_once_dir") and task.get("accident_type"):
        marker = Path(faults["crash_once_dir"]) / f"{task['scenario']}_{task['accident_type']}.crashed"
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("worker killed once")
            os._exit(1)
