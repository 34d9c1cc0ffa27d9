"""What a dataset teaches, measured from its rows: the figures of ``stats.json`` -> ``quality``.

Read from emitted rows only (messages, turns, the recorded trace, the initial
config), so every generator is measured alike:

- ``query_frames``: distinct sentence frames of the users' requests. A frame
  keeps the clause-level words (pronouns, modals, connectives, politeness:
  `FRAME_WORDS`) and punctuation, turns every run of other words (the
  content: goals, values, nouns; a parenthesis) into one ``X``, and says a
  repeated part once. "Could you X, and then X, and then X?" is the frame
  "could you X , and then X ?" whatever X is.
- ``ungrammatical_queries``: requests where a modal or an imperative lead-in
  ("could you", "to", "please") is followed by a third-person verb that opens
  one of the environment's tool descriptions ("could you adjusts").
  ``query_frames_90``: the fewest frames that cover 90% of the sentences.
- ``flow_share``: of the traces (one per user goal), the share where some
  argument equals a distinctive value that an earlier step of the same trace
  returned and the request does not say (an output-to-input flow the model must carry);
  ``traces_with_cross_turn_flow``: traces where such a value comes from an earlier turn's output.
- ``steps_after_target_share``: of all ground-truth steps, the share after the
  trace's target tool was first called (filler the request never asked for).
- ``leaked_values``: arguments whose value the user states but could not
  know: it is in no earlier message the user saw (the initial config, which
  is the user's own data, counts as known) and an earlier tool output of the
  sample returned it.
- ``borrowed_values``: arguments grounded in the user's words although their
  value was said only for another step (more uses in a turn than mentions in
  its request) or only in an earlier turn.
- ``think_skeletons``: distinct frames of ``<think>`` blocks; ``closing_reply_frames``:
  distinct frames of the final answers of turns that called tools;
  ``closing_replies_naming_tools``: final answers that name a tool;
  ``closing_replies_reporting_results``: final answers that state a value the turn's calls returned.
- ``raw_parameter_names``: user messages and assistant answers that contain a
  parameter identifier verbatim (``cityB``, ``file_name``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from palaestra.datagen.argfill import leaves
from palaestra.datagen.grounding import mentions, parse_call

FRAME_WORDS = frozenset(
    """
    i me my mine we us our you your it its they them their he she this that these those what which
    who could can would will should may might must shall do does did is are was were be been am 'd
    'm 're 've 'll please thanks thank and or but then after once before also first next finally
    when while so because since if as soon afterwards later now here there not no yes let help need
    want like hi hello ok okay sure done
    """.split()  # noqa: SIM905
)
_TOKEN_RE = re.compile(
    r"(?<![A-Za-z])'[^']*'(?![A-Za-z])|\"[^\"]*\"|'d|'m|'re|'ve|'ll|[A-Za-z]+|\d+(?:[.,]\d+)*|[?.;,!:()]"
)
_LEADS = ("could you", "can you", "would you", "you to", "please", "help me", "need to", "want to", "i'd like to")


def frame(text: str) -> str:
    """The clause-level skeleton of `text` (see the module docstring)."""
    out: list[str] = []
    text = re.sub(r"\([^()]*\)", " X ", text)  # a parenthesis holds details (content)
    for tok in _TOKEN_RE.findall(text.lower()):
        word = tok if tok in FRAME_WORDS or tok in "?.;,!:()" else "X"
        if not (word == "X" and out and out[-1] == "X"):
            out.append(word)
    for size in range(1, 9):  # "X, and then X, and then X" is the frame "X, and then X"
        i = 0
        while i + 2 * size <= len(out):
            if out[i : i + size] == out[i + size : i + 2 * size]:
                del out[i + size : i + 2 * size]
            else:
                i += 1
    return " ".join(out)


def sentence_frames(text: str) -> set[str]:
    """Frames of each sentence of `text`."""
    return {frame(s) for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s.strip()}


def third_person_verbs(docs: list[dict]) -> set[str]:
    """First words of the tool descriptions that are third-person verbs ("adjusts", "retrieves")."""
    verbs = set()
    for doc in docs:
        text = (doc.get("description") or "").split("Tool description:", 1)[-1].strip()
        first = re.match(r"[A-Za-z]+", text)
        if first and first.group(0).lower().endswith("s") and not first.group(0).lower().endswith("ss"):
            verbs.add(first.group(0).lower())
    return verbs


def ungrammatical(text: str, verbs: set[str]) -> bool:
    low = " " + " ".join(re.findall(r"[a-z']+", text.lower())) + " "
    return any(f" {lead} {v} " in low for lead in _LEADS for v in verbs)


def _distinctive(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, float) and not value.is_integer():
        return True
    if isinstance(value, int | float):
        return abs(value) >= 100
    return isinstance(value, str) and len(value) >= 4


def _scalars(value: Any) -> list:
    if isinstance(value, list | tuple):
        return [x for v in value for x in _scalars(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _scalars(v)]
    return [value]


def _traces_per_turn(row: dict) -> list[dict | None]:
    """The recorded trace behind each turn (a miss turn and its answer share one)."""
    traces = json.loads(row["provenance"]["trace"])
    out: list[dict | None] = []
    k = 0
    for turn in row["turns"]:
        if turn["kind"] in ("miss_param", "miss_func"):
            out.append(traces[k] if k < len(traces) else None)
        else:
            out.append(traces[k] if k < len(traces) else None)
            k += 1
    return out


def _answers(messages: list[dict]) -> list[tuple[int, str]]:
    """(index, text after </think>) of assistant messages without tool calls."""
    return [
        (i, (m.get("content") or "").split("</think>")[-1].strip())
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and not m.get("tool_calls")
    ]


def _covering(counts: list[int], share: float) -> int:
    """The fewest of these frames whose counts cover `share` of all sentences."""
    total, acc = sum(counts), 0
    for k, c in enumerate(sorted(counts, reverse=True)):
        acc += c
        if acc >= share * total:
            return k + 1
    return 0


def quality_figures(rows: list[dict]) -> dict:
    """The figures of the module docstring over `rows`."""
    from palaestra.datagen.envs import get_env

    frames: dict[str, int] = {}
    thinks: set[str] = set()
    closings: set[str] = set()
    n = dict.fromkeys(
        [
            "queries",
            "ungrammatical_queries",
            "traces",
            "traces_with_flow",
            "traces_with_cross_turn_flow",
            "steps",
            "steps_after_target",
            "leaked_values",
            "leaked_samples",
            "borrowed_values",
            "borrowed_samples",
            "think_blocks",
            "closing_replies",
            "closing_replies_naming_tools",
            "closing_replies_reporting_results",
            "raw_parameter_names",
        ],
        0,
    )
    for row in rows:
        spec = get_env(row["provenance"]["env"])
        verbs = third_person_verbs(spec.docs)
        params = {p for d in spec.docs for p in (d.get("parameters") or {}).get("properties", {})}
        raw_params = {p for p in params if "_" in p or re.search(r"[a-z][A-Z]", p)}
        known = row.get("initial_config") or ""
        messages = row["messages"]
        for m in messages:
            text = m.get("content") or ""
            if m["role"] == "assistant":
                for block in re.findall(r"<think>(.*?)</think>", text, flags=re.S):
                    n["think_blocks"] += 1
                    thinks.add(frame(block))
                text = text.split("</think>")[-1]
            if m["role"] in ("user", "assistant") and any(
                re.search(rf"(?<![A-Za-z0-9_]){re.escape(p)}(?![A-Za-z0-9_])", text) for p in raw_params
            ):
                n["raw_parameter_names"] += 1
        leaked = borrowed = 0
        outputs: list[Any] = []  # scalar values returned by earlier steps of the sample
        traces = _traces_per_turn(row)
        user_idx = [i for i, m in enumerate(messages) if m["role"] == "user"]
        u = 0
        for t, turn in enumerate(row["turns"]):
            query = turn.get("query") or ""
            if query and turn["kind"] != "func_added":
                n["queries"] += turn["kind"] != "param_given"
                if turn["kind"] != "param_given":
                    for f in sentence_frames(query):
                        frames[f] = frames.get(f, 0) + 1
                    n["ungrammatical_queries"] += ungrammatical(query, verbs)
            seen_before = ""
            if query and u < len(user_idx):
                seen_before = " ".join(a for i, a in _answers(messages) if i < user_idx[u])
                u += 1
            # the request this turn's calls answer (a param_given turn answers the miss_param request too)
            start = t - 1 if turn["kind"] in ("param_given", "func_added") and t > 0 else t
            own = "\n".join(x.get("query") or "" for x in row["turns"][start : t + 1])
            earlier = "\n".join(x.get("query") or "" for x in row["turns"][:start])
            trace = traces[t]
            if not turn["ground_truth"] or trace is None:
                continue
            steps = trace["steps"]
            n["traces"] += 1
            n["steps"] += len(steps)
            first = next((i for i, s in enumerate(steps) if s["name"] == trace.get("target")), len(steps) - 1)
            first = len(steps) - 1 if trace.get("parallel") else first  # parallel calls: every one a goal
            n["steps_after_target"] += len(steps) - 1 - first
            flow = cross = False
            uses: dict[str, int] = {}
            turn_outputs: list[Any] = []
            for i, call in enumerate(turn["ground_truth"]):
                _, args = parse_call(call)
                for value in args.values():
                    for v in _scalars(value):
                        if isinstance(v, bool) or v is None:
                            continue
                        said = mentions(v, own)
                        produced = v in outputs + turn_outputs
                        if _distinctive(v) and v in turn_outputs and not said:
                            flow = True  # the model must carry an earlier result into this call
                        elif _distinctive(v) and v in outputs and not said:
                            cross = True  # ... or an earlier turn's result
                        if not said:
                            if _distinctive(v) and mentions(v, earlier) and v not in turn_outputs:
                                borrowed += 1  # said only in an earlier turn
                            continue
                        key = json.dumps(v)
                        uses[key] = uses.get(key, 0) + 1
                        if uses[key] > said and v not in turn_outputs:
                            borrowed += 1  # said once, used again for another step (and no output gives it)
                        first_use = uses[key] == 1 and not mentions(v, earlier)
                        if first_use and _distinctive(v) and produced and not mentions(v, known + seen_before):
                            leaked += 1
                if i < len(steps):
                    turn_outputs += [v for _, x in leaves(steps[i]["output"], "result") for v in _scalars(x)]
            outputs += turn_outputs
            n["traces_with_flow"] += flow
            n["traces_with_cross_turn_flow"] += cross
        for i, text in _answers(messages):
            if i == 0 or messages[i - 1]["role"] != "tool":
                continue  # a refusal or a question, not the closing answer of a turn that called tools
            n["closing_replies"] += 1
            closings.add(frame(text))
            n["closing_replies_naming_tools"] += any(
                re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) for name in spec.tool_names
            )
            results = []
            for m in reversed(messages[:i]):
                if m["role"] != "tool":
                    break
                try:
                    results += [v for _, x in leaves(json.loads(m["content"]), "result") for v in _scalars(x)]
                except (json.JSONDecodeError, TypeError):
                    continue
            n["closing_replies_reporting_results"] += any(
                mentions(v, text) for v in results if not isinstance(v, bool) and v not in (None, "")
            )
        n["leaked_values"] += leaked
        n["leaked_samples"] += leaked > 0
        n["borrowed_values"] += borrowed
        n["borrowed_samples"] += borrowed > 0
    return {
        **n,
        "query_frames": len(frames),
        "query_frames_90": _covering(list(frames.values()), 0.9),
        "think_skeletons": len(thinks),
        "closing_reply_frames": len(closings),
        "flow_share": n["traces_with_flow"] / n["traces"] if n["traces"] else 0.0,
        "steps_after_target_share": n["steps_after_target"] / n["steps"] if n["steps"] else 0.0,
    }
