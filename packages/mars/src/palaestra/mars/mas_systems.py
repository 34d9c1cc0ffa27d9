"""MARS's two multi-agent systems, MASLab's MAD and AutoGen, written from MASLab's descriptions.

MARS evaluates its checkpoints inside MASLab (MASWorks/MASLab ``methods/mad``, ``methods/autogen``). The roles,
rounds, stopping rules and who sees what follow MASLab; the prompts are this project's words with the same
structure.

- ``mad`` (multi-agent debate, Liang et al.): the affirmative debater answers the question; the negative
  debater is told it disagrees with that answer and gives its own; a moderator reads both and answers in JSON
  whether one side is clearly right, with the answer (``debate_answer``). A non-empty answer ends the debate;
  otherwise both debaters reply to each other's latest argument and the moderator judges again, for at most
  ``rounds`` rounds (MASLab: 3). Undecided after the last, a judge (the moderator's instructions) reads the
  first-round arguments, lists the candidate answers, then gives the final one in JSON.
- ``autogen`` (AutoGen's two-agent chat): an assistant (told to solve step by step, end with the final answer
  and reply TERMINATE when done) gets the question from a user proxy, itself an LLM with no system prompt
  that answers the assistant's messages. The chat ends when either writes TERMINATE, or after ``turns``
  assistant replies (MASLab: 3); the assistant's last reply is the answer.

A thinking model's ``<think>`` span is private: every message an agent keeps or passes on is its reply
without it (`palaestra.mars.mas_scoring.visible`), as Qwen3's chat template also drops earlier thinking.
Every question runs at once: one batched call per step, over the questions still going.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from palaestra.mars.mas_scoring import visible

Params = Callable[[int], Any]
"""Call index -> the `SamplingParams` of that call (each call its own seed)."""

DEBATER = (
    "You are a debater. Welcome to the debate. You need not agree with the other side: the aim is to find the "
    "correct answer. The topic of the debate:\n{topic}"
)
MODERATOR = (
    'You are the moderator of a debate between two debaters, who give their answers to this topic: "{topic}"\n'
    "After each round you evaluate their answers and decide which one is correct."
)
NEGATIVE = "{answer}\n\nYou disagree with my answer. Give your own answer and your reasons."
REPLY = "{answer}\n\nDo you agree with my view? Give your reasons and your answer."
JUDGE_ROUND = (
    "The {round} round of the debate has ended.\n\nThe affirmative side argues:\n{affirmative}\n\nThe negative side "
    "argues:\n{negative}\n\nAs the moderator, decide whether one answer is clearly preferable. If so, summarize "
    "why and give the answer you believe is correct: the debate ends. If not, the debate goes on. Reply in JSON "
    'only, in this form: {{"Whether there is a preference": "Yes or No", "Supported Side": "Affirmative or '
    'Negative", "Reason": "", "debate_answer": ""}}.'
)
JUDGE_CANDIDATES = (
    "The affirmative side argues: {affirmative}\n\nThe negative side argues: {negative}\n\nWhich answer "
    "candidates are there? List them, without reasons."
)
JUDGE_FINAL = (
    "So, {topic}\nSummarize your reasons and give the answer you believe is correct. Reply in JSON only, in this "
    'form: {{"Reason": "", "debate_answer": ""}}.'
)
ROUND_NAMES = ("first", "second", "third", "fourth", "fifth")
ASSISTANT = (
    "You are a helpful AI assistant. Solve the task with your language skills; do not write code. Work step by "
    "step; if no plan is given, state your plan first. Check an answer carefully before you give it, with "
    'evidence where you can. End every reply with the current final answer (for example "The final answer is '
    '\\boxed{...}"), so it is available even if the chat stops. Reply "TERMINATE" at the end when everything '
    "is done."
)
TERMINATE = "TERMINATE"


def _ask(client, convs: list[list[dict]], params: Params, call: int) -> list[str]:
    """The visible replies to `convs` (one batched call)."""
    if not convs:
        return []
    return [visible(c.text) for c in client.chat(convs, params(call))]


def _verdict(text: str) -> dict[str, Any]:
    """The moderator's or judge's JSON (fenced or not, single-quoted or not); {} when there is none."""
    found = re.search(r"\{.*\}", re.sub(r"```(?:json)?", "", text), flags=re.DOTALL)
    if not found:
        return {}
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(found.group(0))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return {}


def _round(n: int) -> str:
    return ROUND_NAMES[n - 1] if n <= len(ROUND_NAMES) else f"{n}th"


def run_mad(client, prompts: list[str], params: Params, rounds: int = 3) -> list[dict[str, Any]]:
    """MAD on every prompt: ``{"response": the answer, "rounds": rounds held, "judged": whether the judge
    decided, "transcript": [(speaker, text), ...]}``."""
    n = len(prompts)
    aff = [[{"role": "system", "content": DEBATER.format(topic=p)}, {"role": "user", "content": p}] for p in prompts]
    neg = [[{"role": "system", "content": DEBATER.format(topic=p)}] for p in prompts]
    mod = [[{"role": "system", "content": MODERATOR.format(topic=p)}] for p in prompts]
    talk: list[list[tuple[str, str]]] = [[] for _ in prompts]
    first: list[tuple[str, str]] = [("", "")] * n
    answer: list[str | None] = [None] * n
    held = [0] * n
    call = 0
    last_aff: list[str] = [""] * n
    last_neg: list[str] = [""] * n
    for rnd in range(1, rounds + 1):
        live = [i for i in range(n) if answer[i] is None]
        if not live:
            break
        if rnd > 1:
            for i in live:
                aff[i].append({"role": "user", "content": REPLY.format(answer=last_neg[i])})
        for i, text in zip(live, _ask(client, [aff[i] for i in live], params, call)):
            aff[i].append({"role": "assistant", "content": text})
            last_aff[i] = text
            talk[i].append(("affirmative", text))
        for i in live:
            prompt = NEGATIVE if rnd == 1 else REPLY
            neg[i].append({"role": "user", "content": prompt.format(answer=last_aff[i])})
        for i, text in zip(live, _ask(client, [neg[i] for i in live], params, call + 1)):
            neg[i].append({"role": "assistant", "content": text})
            last_neg[i] = text
            talk[i].append(("negative", text))
            if rnd == 1:
                first[i] = (last_aff[i], text)
        for i in live:
            ask = JUDGE_ROUND.format(round=_round(rnd), affirmative=last_aff[i], negative=last_neg[i])
            mod[i].append({"role": "user", "content": ask})
        for i, text in zip(live, _ask(client, [mod[i] for i in live], params, call + 2)):
            mod[i].append({"role": "assistant", "content": text})
            talk[i].append(("moderator", text))
            held[i] = rnd
            decided = str(_verdict(text).get("debate_answer", "") or "").strip()
            answer[i] = decided or None
        call += 3
    judged = [i for i in range(n) if answer[i] is None]
    judge = {i: [{"role": "system", "content": MODERATOR.format(topic=prompts[i])}] for i in judged}
    for i in judged:
        affirmative, negative = first[i]
        judge[i].append(
            {"role": "user", "content": JUDGE_CANDIDATES.format(affirmative=affirmative, negative=negative)}
        )
    for i, text in zip(judged, _ask(client, [judge[i] for i in judged], params, call)):
        judge[i] += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": JUDGE_FINAL.format(topic=prompts[i])},
        ]
        talk[i].append(("judge", text))
    for i, text in zip(judged, _ask(client, [judge[i] for i in judged], params, call + 1)):
        talk[i].append(("judge", text))
        answer[i] = str(_verdict(text).get("debate_answer", "") or "").strip() or text  # no JSON: its reply
    return [
        {"response": answer[i] or "", "rounds": held[i], "judged": i in judged, "transcript": talk[i]} for i in range(n)
    ]


def run_autogen(client, prompts: list[str], params: Params, turns: int = 3) -> list[dict[str, Any]]:
    """AutoGen's assistant and LLM user proxy on every prompt: ``{"response": the assistant's last reply,
    "turns": its replies, "transcript": [(speaker, text), ...]}``."""
    n = len(prompts)
    assistant = [[{"role": "system", "content": ASSISTANT}, {"role": "user", "content": p}] for p in prompts]
    proxy: list[list[dict]] = [[{"role": "assistant", "content": p}] for p in prompts]  # the proxy asked it
    talk: list[list[tuple[str, str]]] = [[("user_proxy", p)] for p in prompts]
    last = [""] * n
    replies = [0] * n
    live = list(range(n))
    for turn in range(turns):
        for i, text in zip(live, _ask(client, [assistant[i] for i in live], params, 2 * turn)):
            assistant[i].append({"role": "assistant", "content": text})
            proxy[i].append({"role": "user", "content": text})
            talk[i].append(("assistant", text))
            last[i], replies[i] = text, replies[i] + 1
        live = [i for i in live if TERMINATE not in last[i]]
        if turn == turns - 1 or not live:
            break
        for i, text in zip(live, _ask(client, [proxy[i] for i in live], params, 2 * turn + 1)):
            proxy[i].append({"role": "assistant", "content": text})
            assistant[i].append({"role": "user", "content": text})
            talk[i].append(("user_proxy", text))
            if TERMINATE in text:
                talk[i].append(("end", TERMINATE))
        live = [i for i in live if talk[i][-1][0] != "end"]
        if not live:
            break
    return [{"response": last[i], "turns": replies[i], "transcript": talk[i]} for i in range(n)]


def run_single(client, prompts: list[str], params: Params) -> list[dict[str, Any]]:
    """One answer per prompt, no system: the model alone, for the table's reference row."""
    texts = [c.text for c in client.chat([[{"role": "user", "content": p}] for p in prompts], params(0))]
    return [{"response": t, "transcript": [("single", visible(t))]} for t in texts]
