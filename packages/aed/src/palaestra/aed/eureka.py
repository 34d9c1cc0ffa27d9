"""Eureka-style reward design: an LLM writes reward code per accident type, refined by training feedback.

Round r: the LLM sees the task (the accident type and its description), the
documented state API (`rewards.STATE_API`) and, from round 2 on, the previous
round's reward with its training statistics (or why it was refused). It
answers with a ``reward(state)`` function in a python code block (each of
the round's samples drawn with its own seed, `draw_samples`). Each
candidate is checked (`allowlist.static_check`), probed in the sandbox on real
states, then used to train an adversary briefly; its fitness is the rate of
victim accidents of the target type per evaluation episode (ties: any
accident), reported with its 95% Wilson interval. The best candidate over all
rounds is kept.

Reflection as in Eureka: the reward may return named components (a dict);
the feedback lists, for each component and for the success rates, the value
every ``log_every`` training steps (the per-episode mean over the episodes
that ended in that window) with its maximum, mean and minimum.

If every candidate fails, the result says so (``fallback=True`` with the
reasons) and the caller trains on the expert reward: the run never stops.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from palaestra.aed.adversary import AdversarySpec, TrainSettings, build_model, make_env, train_adversary
from palaestra.aed.allowlist import ALLOWED_TEXT
from palaestra.aed.evaluation import evaluate
from palaestra.aed.rewards import STATE_API, TAXONOMY
from palaestra.aed.sandbox import check_reward

SYSTEM = (
    "You are a reward engineer for reinforcement learning. You write Python reward functions that train an "
    "adversarial vehicle to provoke a specific kind of accident of an automated vehicle in a driving simulator."
)

TASK = """Accident type to provoke: {type} ({description}).
Scenario: {scenario}. The adversary drives with discrete actions (lane left, idle, lane right, faster, slower).

{api}{allowed}
Good rewards give dense shaping toward the pre-crash geometry of this accident type and a large bonus when the \
victim collides in this way; penalize the adversary crashing into others or leaving the road.

Answer with one python code block that defines reward(state) and nothing else."""

FEEDBACK_OK = """We trained an adversary with your reward function {round_label} and tracked the values of the \
individual reward components and the success rates every {every} training steps, with the maximum, mean and \
minimum values encountered:
{series}
Over {episodes} evaluation episodes: victim accidents per episode {asr:.2f} [95% CI {asr_lo:.2f}, {asr_hi:.2f}], \
of the target type {target_rate:.2f} [95% CI {target_lo:.2f}, {target_hi:.2f}], accident types {types}, \
mean episode return {mean_return:.2f}{errors}.
Analyse which components help or hurt (e.g. one whose values barely change is not learned from; one that \
dominates the others should be rescaled), then write an improved reward(state) in one python code block."""

FEEDBACK_FAIL = """Your reward function could not be used: {reason}.
Fix it and answer with one python code block defining reward(state) that returns a float (or a dict of named \
floats). {allowed}"""


def extract_code(text: str) -> str:
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text or "", flags=re.S)
    if blocks:
        return max(blocks, key=lambda b: "def reward" in b)
    start = (text or "").find("def reward")
    return text[start:] if start >= 0 else (text or "")


def probe_states(spec: AdversarySpec, steps: int = 6, seed: int = 0) -> list[dict]:
    """Real reward states from a few random steps, plus one with a victim collision event."""
    env = make_env(replace(spec, reward_code=None, preference_model=None))
    env.reset(seed=seed)
    states = []
    for _ in range(steps):
        env.step(env.action_space.sample())
        states.append(env.state(0, env._event([], [])))
    crash = json.loads(json.dumps(states[-1]))
    crash["event"].update({"victim_collision": 1.0, "with_adversary": 1.0, "accident_type": spec.accident_type})
    env.close()
    return states + [crash]


def design_reward(
    client,
    spec: AdversarySpec,
    settings: TrainSettings,
    rounds: int = 3,
    samples: int = 2,
    eval_episodes: int = 5,
    seed: int = 0,
    temperature: float = 0.8,
    max_tokens: int = 768,
    log=None,
    log_every: int | None = None,
) -> dict[str, Any]:
    """Run the Eureka loop; return ``{"code", "fitness", "round", "history", "fallback", "reason"}``.

    ``log_every``: timesteps between the reflection's statistics (default: a tenth of the candidate's training)."""
    from palaestra.shared.llm import SamplingParams

    probes = probe_states(spec, seed=seed)
    described = {t["name"]: t["description"] for t in spec.taxonomy or []}
    api = STATE_API
    if spec.taxonomy:  # LLM-proposed types: state["event"]["accident_type"] takes their names
        api += f"In this run state['event']['accident_type'] is one of: {', '.join(described)}, other.\n"
    task = TASK.format(
        type=spec.accident_type,
        description=described.get(spec.accident_type) or TAXONOMY.get(spec.accident_type, spec.accident_type),
        scenario=spec.scenario,
        api=api,
        allowed=ALLOWED_TEXT,
    )
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    history: list[dict] = []
    best: dict | None = None
    for r in range(rounds):
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=False)
        outs = draw_samples(client, conversation, params, samples, seed, r)
        round_best: dict | None = None
        for k, out in enumerate(outs):
            code = extract_code(out.text)
            entry: dict[str, Any] = {"round": r, "sample": k, "code": code, "response": out.text}
            reason = check_reward(code, probes)
            if reason is None:
                cand = replace(spec, reward_code=code)
                model = build_model(cand, settings, seed + r)
                every = log_every or max(1, settings.timesteps // 10)
                stats = train_adversary(model, settings.timesteps, log_every=every, target=spec.accident_type)
                ev = evaluate(model, cand, eval_episodes, seed=seed + 10_000)
                model.get_env().close()
                target = ev["types"].get(spec.accident_type, 0) / max(1, eval_episodes)
                entry.update(
                    status="ok",
                    asr=ev["asr"],
                    target_rate=target,
                    asr_ci=ev["asr_ci"],
                    target_rate_ci=ev["target_rate_ci"],
                    curve=stats["curve"],
                    every=every,
                    types=ev["types"],
                    mean_return=ev["mean_return"],
                    reward_errors=stats["reward_errors"],
                    fitness=target + 0.1 * ev["asr"],
                )
                if stats["reward_errors"]:  # the sandbox killed it mid-training: the env fell back to the expert's
                    entry.update(status="failed", reason=stats["reward_errors"][0], fitness=-1.0)
            else:
                entry.update(status="failed", reason=reason, fitness=-1.0)
            history.append(entry)
            if round_best is None or entry["fitness"] > round_best["fitness"]:
                round_best = entry
        if log is not None:
            ok = [h for h in history if h["round"] == r and h["status"] == "ok"]
            log(
                {"eureka/valid_samples": len(ok), "eureka/best_fitness": max((h["fitness"] for h in ok), default=-1.0)},
                r,
            )
        if round_best["status"] == "ok" and (best is None or round_best["fitness"] > best["fitness"]):
            best = round_best
        conversation = conversation[:2] + [
            {"role": "assistant", "content": round_best["response"]},
            {"role": "user", "content": _feedback(round_best, eval_episodes)},
        ]
    if best is None:
        reasons = sorted({h["reason"] for h in history})
        return {
            "code": None,
            "fallback": True,
            "history": history,
            "reason": f"all {len(history)} LLM reward candidates failed ({'; '.join(reasons)[:500]})",
        }
    return {
        "code": best["code"],
        "fitness": best["fitness"],
        "round": best["round"],
        "history": history,
        "fallback": False,
        "reason": "",
    }


def sample_seed(seed: int, round_index: int, sample: int) -> int:
    """The sampling seed of one candidate: distinct for every (round, sample) of a run."""
    return seed * 1_000_000 + round_index * 1_000 + sample


def draw_samples(client, conversation: list[dict], params, samples: int, seed: int, round_index: int) -> list:
    """`samples` answers to one conversation, each drawn with its own seed (`sample_seed`).

    One call with ``[conversation] * samples`` and one seed gives copies over an OpenAI-compatible server
    (``palaestra serve`` and vLLM seed each request alone: measured 1 distinct text of 4); one call per sample,
    each with its own seed, gives distinct candidates on every backend and stays reproducible."""
    return [
        client.chat([conversation], replace(params, seed=sample_seed(seed, round_index, k)))[0] for k in range(samples)
    ]


def _feedback(entry: dict, episodes: int) -> str:
    if entry["status"] != "ok":
        return FEEDBACK_FAIL.format(reason=entry["reason"], allowed=ALLOWED_TEXT)
    errors = f", reward errors {entry['reward_errors']}" if entry["reward_errors"] else ""
    return FEEDBACK_OK.format(
        round_label=f"(round {entry['round'] + 1})",
        every=entry["every"],
        series=reflection(entry["curve"]),
        episodes=episodes,
        asr=entry["asr"],
        asr_lo=entry["asr_ci"][0],
        asr_hi=entry["asr_ci"][1],
        target_rate=entry["target_rate"],
        target_lo=entry["target_rate_ci"][0],
        target_hi=entry["target_rate_ci"][1],
        types=entry["types"],
        mean_return=entry["mean_return"],
        errors=errors,
    )


def reflection(curve: list[dict[str, Any]]) -> str:
    """Eureka's reward reflection: one line per reward component and success rate, its values along training
    (the learning curve of `train.train_adversary`) with their max, mean and min."""
    series: dict[str, list[float]] = {}
    for point in curve:
        for name, value in point["components"].items():
            series.setdefault(f"component {name}", []).append(value)
    for key in ("target_rate", "attack_rate", "episode_reward", "episode_length"):
        series[key] = [point[key] for point in curve]
    lines = []
    for name, values in series.items():
        if values:
            shown = ", ".join(f"{v:.2f}" for v in values)
            lines.append(
                f"{name}: [{shown}], Max: {max(values):.2f}, Mean: {sum(values) / len(values):.2f}, "
                f"Min: {min(values):.2f}"
            )
    return "\n".join(lines) or "(no episode ended during training)"
