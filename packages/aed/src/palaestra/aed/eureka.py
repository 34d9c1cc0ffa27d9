"""Eureka-style reward design: an LLM writes reward code per accident type, refined by training feedback.

Round r: the LLM sees the task (the accident type and its description), the
documented state API (`rewards.STATE_API`) and, from round 2 on, the previous
round's reward with its training statistics (or why it was refused). It
answers with a ``reward(state)`` function in a python code block (each of
the round's samples drawn with its own seed, `draw_samples`). Each
candidate is checked (`allowlist.static_check`), probed in the sandbox on real
states, then used to train an adversary briefly; every candidate's outcome
(`OUTCOMES`: unparsed, refused by the static check, failed in the sandbox,
failed during training, trained) is printed with its reason or score, kept
in the history and counted per round; its fitness is the rate of
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
import time
from dataclasses import replace
from typing import Any

from palaestra.aed.adversary import AdversarySpec, TrainSettings, build_model, make_env, train_adversary
from palaestra.aed.allowlist import ALLOWED_TEXT, RewardCodeError, static_check
from palaestra.aed.evaluation import evaluate
from palaestra.aed.prompts import FEEDBACK_FAIL, FEEDBACK_OK, SYSTEM, task_prompt
from palaestra.aed.sandbox import check_reward


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
    on_sample=None,
) -> dict[str, Any]:
    """Run the Eureka loop; return ``{"code", "fitness", "round", "history", "fallback", "reason"}``.

    ``log_every``: timesteps between the reflection's statistics (default: a tenth of the candidate's training).
    ``on_sample``: called with each candidate's history entry as soon as its outcome is known."""
    from palaestra.shared.llm import SamplingParams

    probes = probe_states(spec, seed=seed)
    task = task_prompt(spec.accident_type, spec.scenario, spec.taxonomy)
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    history: list[dict] = []
    best: dict | None = None
    for r in range(rounds):
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, logprobs=False)
        start = time.process_time()
        outs = draw_samples(client, conversation, params, samples, seed, r)
        llm_cpu_s = (time.process_time() - start) / max(1, len(outs))  # this process's: an in-process model's cost
        round_best: dict | None = None
        for k, out in enumerate(outs):
            start = time.process_time()
            code = extract_code(out.text)
            entry: dict[str, Any] = {"round": r, "sample": k, "code": code, "response": out.text}
            outcome, reason = screen(code, probes)
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
                    outcome="trained",
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
                    entry.update(status="failed", outcome="training_failed", reason=stats["reward_errors"][0])
                    entry["fitness"] = -1.0
            else:
                entry.update(status="failed", outcome=outcome, reason=reason, fitness=-1.0)
            entry.update(seed=sample_seed(seed, r, k), llm_cpu_s=llm_cpu_s, cpu_s=time.process_time() - start)
            print(f"[aed] eureka {spec.scenario}/{spec.accident_type} {describe_outcome(entry)}", flush=True)
            history.append(entry)
            if on_sample is not None:
                on_sample(entry)
            if round_best is None or entry["fitness"] > round_best["fitness"]:
                round_best = entry
        if log is not None:
            mine = [h for h in history if h["round"] == r]
            ok = [h for h in mine if h["status"] == "ok"]
            counts = {f"eureka/{o}": sum(h["outcome"] == o for h in mine) for o in OUTCOMES}
            best_fitness = max((h["fitness"] for h in ok), default=-1.0)
            log({"eureka/valid_samples": len(ok), "eureka/best_fitness": best_fitness, **counts}, r)
        assert round_best is not None  # at least one sample a round
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


OUTCOMES = ("unparsed", "refused", "sandbox_failed", "training_failed", "trained")
"""What became of a candidate: no reward function in the answer; refused by the static check; failed to load or
on the probe states in the sandbox; killed by the sandbox during training; trained and scored."""


def screen(code: str, probes: list[dict]) -> tuple[str, str | None]:
    """A candidate's outcome before training (`OUTCOMES`) and its reason; ``("ok", None)`` if it may train."""
    if "def reward" not in code:
        return "unparsed", "no reward(state) function in the answer"
    try:
        static_check(code)
    except RewardCodeError as err:
        return "refused", err.reason
    reason = check_reward(code, probes, check=False)  # checked just above
    return ("ok", None) if reason is None else ("sandbox_failed", reason)


def describe_outcome(entry: dict[str, Any]) -> str:
    """One log line of a candidate: its round, sample, outcome and reason or score."""
    where = f"round {entry['round'] + 1} sample {entry['sample'] + 1}: {entry['outcome']}"
    if entry["outcome"] == "trained":
        return f"{where}, fitness {entry['fitness']:.3f} (target-type rate {entry['target_rate']:.2f})"
    return f"{where} ({entry['reason']})"


def sample_record(entry: dict[str, Any]) -> dict[str, Any]:
    """A candidate's outcome in one line of the samples file: no code or answer, only what became of it."""
    keys = ["round", "sample", "seed", "outcome", "reason", "fitness", "target_rate", "asr", "target_rate_ci"]
    keys += ["llm_cpu_s", "cpu_s"]  # CPU-seconds: the round's generation per sample; checking and training it
    record = {k: entry[k] for k in keys if k in entry}
    record.update(answer_chars=len(entry["response"] or ""), code_lines=len(entry["code"].splitlines()))
    return record


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
