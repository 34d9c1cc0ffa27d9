"""Natural language for the deterministic roles: grammatical, varied, and free of raw identifiers.

- `imperative`: a tool description's first sentence as a request ("Adjusts
  the climate control" -> "adjust the climate control"): BFCL's third-person
  descriptions pasted after "could you" are ungrammatical.
- `param_phrase`: what a user calls a parameter: its words (``file_name`` ->
  "file name"), or, where those are no words a user says (``cityB``, ``a``),
  the noun phrase its description opens with ("the zipcode of the second
  city" -> "zipcode of the second city").
- `value_text`: a value as a user writes it (strings quoted, so a common word
  is visibly a value).
- `report`: a final answer that states what the calls returned, never a tool name.

Every list of alternatives is drawn from with the sample's rng, so one seed
gives one text and many seeds give many frames.
"""

from __future__ import annotations

import random
import re
from typing import Any

from palaestra.datagen.argfill import leaves


def short_description(doc: dict) -> str:
    """The tool-specific sentence of a BFCL description (after 'Tool description:')."""
    text = doc.get("description", "")
    text = text.split("Tool description:", 1)[-1].strip()
    return text.split(". ")[0].rstrip(".") or doc["name"]


def base_form(verb: str) -> str:
    """Third person singular -> base form ("adjusts" -> "adjust", "searches" -> "search", "applies" -> "apply")."""
    low = verb.lower()
    if not low.endswith("s") or low.endswith("ss") or len(low) < 4:
        return verb
    if low.endswith("ies"):
        return verb[:-3] + "y"
    if re.search(r"(ch|sh|x|z|o)es$", low):
        return verb[:-2]
    return verb[:-1]


def imperative(doc: dict) -> str:
    """The description's first sentence as an instruction, lowercase first word, base-form verb."""
    text = short_description(doc)
    first, _, rest = text.partition(" ")
    return (base_form(first).lower() + (" " + rest if rest else "")).strip()


def words(name: str) -> str:
    """``receiverId`` / ``receiver_id`` -> ``receiver id``."""
    return " ".join(re.findall(r"[a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", name).lower()))


def param_phrase(param: str, pspec: dict | None = None) -> str:
    """What a user calls `param` (see the module docstring)."""
    plain = words(param)
    odd = any(len(w) == 1 for w in plain.split()) or not plain
    desc = ((pspec or {}).get("description") or "").strip()
    m = re.match(r"(?:(?:the|a|an)\s+)?([a-z][a-z ]{2,60}?)(?:[.,;(]|$| to be| that| which| in the format)", desc, re.I)
    if odd and m and len(m.group(1).split()) <= 8:
        return m.group(1).strip().lower()
    return plain


def value_text(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(value_text(v) for v in value) if value else "nothing"
    if isinstance(value, dict):
        return ", ".join(f"{words(k)} {value_text(v)}" for k, v in value.items())
    return repr(value)


def detail(param: str, value: Any, pspec: dict | None, rng: random.Random) -> str:
    """One stated value, in one of several forms."""
    name = param_phrase(param, pspec)
    if isinstance(value, bool):
        return f"{words(param)}: {value_text(value)}"
    forms = ["{n} {v}", "the {n} {v}", "{n}: {v}", "the {n} being {v}"]
    return rng.choice(forms).format(n=name, v=value_text(value))


OPENERS = [
    "Could you {g}?",
    "I'd like you to {g}.",
    "Please {g}.",
    "I need you to {g}.",
    "Can you help me {g}?",
    "Would you {g}?",
    "Hi! Can you {g}?",
    "I want to {g}. Can you do that for me?",
    "Here's what I need: {g}.",
    "Quick one: {g}, please.",
    "My task today is to {g}. Please take care of it.",
    "Go ahead and {g}.",
]
SELF_OPENERS = {
    "Can you help me {g}?",
    "I want to {g}. Can you do that for me?",
    "My task today is to {g}. Please take care of it.",
}
"""Openers where the user does the goal: they do not fit a goal said to the assistant ("show me ...")."""


def openers(goal: str) -> list[str]:
    """The openers that fit `goal`: none of `SELF_OPENERS` for "show me ...", "tell me ..." and the like."""
    return [o for o in OPENERS if o not in SELF_OPENERS] if addressed(goal) else OPENERS


def addressed(goal: str) -> bool:
    """Whether the goal is said to the assistant about the user ("show me ...", "tell me ...", "sign me in")."""
    return bool(re.match(r"\w+ me\b", goal))


GOAL_FIRST = [
    "My goal is to {goal}. To get there, {pre} first.",
    "I want to {goal}; before that, {pre}.",
    "Please {goal}. You'll have to {pre} beforehand.",
    "Can you {goal}? It only works once you {pre}.",
]
JOINERS = [", then ", "; after that, ", ", and once that's done, ", " and then ", ". Next, ", ", followed by: "]
NOISE = [
    "I'm in a bit of a rush today.",
    "Thanks a lot in advance!",
    "This came up during our weekly sync.",
    "No need for a long explanation.",
    "My colleague asked me to handle this.",
    "Appreciate it.",
    "Let me know when it's done.",
    "It's for a report I'm writing.",
    "Sorry for the short notice.",
    "Cheers!",
]
CONTEXT = ["My {d}.", "For reference, my {d}.", "In case you need them: {d}.", "You'll need these: {d}."]


def join_goals(goals: list[str], rng: random.Random) -> str:
    if len(goals) == 1:
        return goals[0]
    joiner = rng.choice(JOINERS)
    if rng.random() < 0.3:
        return "first " + joiner.join(goals[:-1]) + rng.choice([", and finally ", "; finally, "]) + goals[-1]
    return joiner.join(goals)


def join_parallel(goals: list[str], rng: random.Random) -> str:
    """Several independent goals in one request (a parallel turn): no order between them, so no "then"."""
    joiner = rng.choice([" and ", ", and also ", "; also ", ", plus "])
    if len(goals) > 2:
        return ", ".join(goals[:-1]) + joiner + goals[-1]
    return joiner.join(goals)


REPORT_INTROS = [
    "All done.",
    "Done.",
    "That's taken care of.",
    "Finished.",
    "Here you go.",
    "Everything went through.",
    "OK, that worked.",
]
REPORT_FORMS = ["{k}: {v}", "the {k} is {v}", "{k} {v}"]


QUOTE = 80
"""A text longer than this is quoted in part (its start, then an ellipsis and its length)."""


def _fact_text(value: Any) -> str:
    if isinstance(value, str) and len(value) > QUOTE:
        head = " ".join(value[:QUOTE].split())
        return f"'{head}...' ({len(value)} characters)"
    if isinstance(value, list) and len(value) > 5:
        return value_text(value[:5]) + f" and {len(value) - 5} more"
    return value_text(value)


def report(results: list[Any], rng: random.Random, per_output: int = 2) -> str:
    """A closing answer that states what each requested call returned (the last first), in words.

    Every result with content gives at least one fact; a long text is quoted in part (`QUOTE`), never
    skipped, so a ``cat`` or a ``diff`` the user asked for is in the reply."""
    facts: list[str] = []
    for output in reversed(results):
        taken = 0
        for key, value in leaves(output, "result"):
            if taken >= per_output or isinstance(value, dict) or value in ("", [], None):
                continue
            name = words(key)
            text = _fact_text(value)
            fact = text if name in ("", "result") else rng.choice(REPORT_FORMS).format(k=name, v=text)
            if fact not in facts:
                facts.append(fact)
                taken += 1
    intro = rng.choice(REPORT_INTROS)
    if not facts:
        return intro + " " + rng.choice(["The calls returned no details.", "No details came back."])
    lead = rng.choice(["Here is what came back: ", "The result: ", "Results: ", "What I got: "])
    return f"{intro} {lead}{'; '.join(facts)}."
