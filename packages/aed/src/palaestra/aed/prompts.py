"""The prompts of the Eureka loop (`palaestra.aed.eureka`), kept apart so that ``palaestra plan`` can size them
without importing the training stack: the task, the feedback after a trained or a refused candidate."""

from __future__ import annotations

from palaestra.aed.allowlist import ALLOWED_TEXT
from palaestra.aed.rewards import STATE_API, TAXONOMY

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


def task_prompt(accident_type: str, scenario: str, taxonomy: list[dict] | None = None) -> str:
    """The first user message: the accident type, the state API, what the code may use."""
    described = {t["name"]: t.get("description", "") for t in taxonomy or []}
    api = STATE_API
    if taxonomy:  # LLM-proposed types: state["event"]["accident_type"] takes their names
        api += f"In this run state['event']['accident_type'] is one of: {', '.join(described)}, other.\n"
    return TASK.format(
        type=accident_type,
        description=described.get(accident_type) or TAXONOMY.get(accident_type, accident_type),
        scenario=scenario,
        api=api,
        allowed=ALLOWED_TEXT,
    )
