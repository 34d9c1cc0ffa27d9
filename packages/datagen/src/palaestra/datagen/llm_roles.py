"""LLM implementations of the four roles, through any `LLMClient`, with prompts in ``prompts/*.txt``.

Each role parses its model's answer robustly (a ``<think>`` block, code
fences, a preamble such as "Here is the request:", surrounding quotes are
taken off) and checks it; an answer that fails makes the role return None
(tool maker, query writer) or an empty hint (critic), with the reason in
``last_drop`` and counted per role in `CountingClient.drops`
(``"query_writer:missing_value"``, ``"tool_maker:no_json"``, ...); the
pipeline drops the sample under that reason. The reasoner's failures are the
guided chain's (``unverified:<why>``). Checks per role:

- tool maker: a JSON object with a snake_case ``name`` and a 10-600 character ``description``;
- query writer: 10-2000 characters, every value the user knows stated
  (`grounding.stated`: the same test the verifier applies), every criterion
  that singles out a record ("the highest priority"), no tool name. Its
  prompt asks for the user's goal in the user's words (the trace's last
  call), what the goal needs that the user asks for too (a login, a change
  it depends on), what the assistant looks up itself, and only values a
  user can know (the sampler never asks the user for a tool-made value);
- critic: the text after ``</think>``, at most 600 characters (the chain
  redacts any call or value it leaks).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from string import Template

from palaestra.datagen.grounding import stated
from palaestra.datagen.phrasing import NOISE, imperative, param_phrase, value_text, words
from palaestra.datagen.roles import AdvancedTool, DeterministicToolMaker, Query
from palaestra.shared.llm.base import LLMClient, LLMError, SamplingParams
from palaestra.shared.toolcall import parse_response

PROMPTS = Path(__file__).parent / "prompts"
PREAMBLE_RE = re.compile(r"^\s*(?:here(?:'s| is)[^:\n]*|sure[^:\n]*|request|user(?:'s)? request|query)\s*:\s*", re.I)


def prompt(name: str, **values) -> str:
    return Template((PROMPTS / f"{name}.txt").read_text()).safe_substitute(**values)


def answer_text(text: str) -> str:
    """The answer proper: after ``</think>``, without code fences, a preamble line or surrounding quotes."""
    text = text.split("</think>")[-1].strip()
    text = re.sub(r"^```[a-zA-Z]*\n?|\n?```$", "", text).strip()
    text = PREAMBLE_RE.sub("", text, count=1).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def first_json_object(text: str) -> dict | None:
    """The first balanced ``{...}`` in `text` that parses as a JSON object."""
    text = text.split("</think>")[-1]
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        depth = 0
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                try:
                    obj = json.loads(text[start : end + 1])
                except json.JSONDecodeError:
                    break
                return obj if isinstance(obj, dict) else None
    return None


# The messages each role sends (also what `estimate` counts for a run that has not happened yet).


def tool_maker_messages(trace, base: AdvancedTool) -> list[dict]:
    """The tool maker's request: the trace's calls with their outputs, and the composite tool's inputs."""
    calls = "\n".join(
        f"{i + 1}. {s.call} -> {json.dumps(s.output, default=str)[:300]}" for i, s in enumerate(trace.steps)
    )
    return [{"role": "user", "content": prompt("tool_maker", calls=calls, inputs=", ".join(base.inputs) or "none")}]


def selector_criteria(trace) -> list[str]:
    """The criteria that single out a record a step takes from a list ("the id of the one with the highest ...")."""
    return [
        f"the {words(s.feed_keys.get(p, p))} of the one with the {sel[1]} {words(sel[0])}"
        for s in trace.steps
        for p, sel in s.selectors.items()
    ]


def query_writer_messages(tool: AdvancedTool, trace, spec, noise: str, omit: Sequence[str] = ()) -> list[dict]:
    """The query writer's request: the user's goal (the trace's last call), what it needs that the user asks for
    too (the stated steps before it), what the assistant looks up, the criteria and the values the user knows
    (all but the omitted ones)."""
    values = [v for k, v in tool.inputs.items() if k not in omit]
    hidden = set(trace.hidden)
    last = len(trace.steps) - 1
    goal = imperative(spec.doc(trace.steps[-1].name)) if trace.steps else tool.description
    before = [f"- {imperative(spec.doc(s.name))}" for i, s in enumerate(trace.steps) if i not in hidden and i < last]
    if getattr(trace, "parallel", False):  # independent goals asked at once: each is a goal, none comes first
        goal, before = " and, independently, ".join(imperative(spec.doc(s.name)) for s in trace.steps), []
    looked_up = [words(s.feed_keys.get(p, p)) for s in trace.steps for p in s.feeds]
    looked_up += [f"{words(k)} (an earlier answer's)" for s in trace.steps for k in s.prior_feeds.values()]
    content = prompt(
        "query_writer",
        goal=goal,
        description=tool.description,
        steps="\n" + "\n".join(before) if before else "none",
        hidden=", ".join(looked_up) or "none",
        criteria="; ".join(selector_criteria(trace)) or "none",
        noise=noise,
        values="; ".join(f"{param_phrase(v['param'])} {value_text(v['value'])}" for v in values) or "none",
    )
    return [{"role": "user", "content": content}]


def reasoner_messages(messages: list[dict]) -> list[dict]:
    """The reasoner's request: its system prompt, then the conversation so far (the tools go beside it)."""
    return [{"role": "system", "content": prompt("reasoner_system")}, *messages]


def critic_messages(turn, attempt_calls, failure: dict) -> list[dict]:
    """The critic's request: the turn's request, the failed try's calls and what went wrong (no ground truth)."""
    calls = ", ".join(f"{c.name}({json.dumps(c.arguments)})" for c in attempt_calls) or "none"
    summary = (
        f"{len(failure.get('missing_tools', []))} expected result(s) missing; "
        f"state {'differs' if failure.get('state_mismatch') else 'matches'}"
    )
    return [{"role": "user", "content": prompt("critic", query=turn.query, calls=calls, failure=summary)}]


USAGE_KEYS = ("requests", "prompt_chars", "completion_chars", "prompt_tokens", "completion_tokens")


class LLMUnavailable(LLMError):
    """Several LLM requests in a row failed: the run stops with one line that names the cause."""


class PromptTooLong(LLMError):
    """A request whose prompt outgrows the model's context: a property of that sample, not of the server."""


# the backends' own words (transformers / vLLM in process: "the model's context is N tokens"; an OpenAI-compatible
# server such as vLLM's: "maximum context length is N tokens")
CONTEXT_RE = re.compile(r"model's context is \d+ tokens|maximum context length", re.I)


def is_context_overflow(message: str) -> bool:
    """Whether a failed request's message says that its prompt does not fit the model's context."""
    return bool(CONTEXT_RE.search(message))


def error_cause(message: str) -> str:
    """A failed request's cause in a few words, and what to do about it."""
    low = message.lower()
    if "enable-auto-tool-choice" in low or "tool-call-parser" in low or "tool choice" in low:
        return (
            "the server refuses requests with tools (vLLM: start it with --enable-auto-tool-choice "
            "--tool-call-parser hermes; see experiments/datagen/llm_served.yaml)"
        )
    if "cannot reach" in low or "connection" in low:
        return "the server does not answer (is it running at roles.llm.base_url?)"
    if is_context_overflow(message):
        return "the prompt outgrows the model's context"
    if "did not answer within" in low:
        return "the server times out (raise roles.llm.timeout_s, or lower workers)"
    status = re.search(r"answered (\d{3})", message)
    return f"the server answers {status[1]}" if status else "the LLM backend fails"


class CountingClient:
    """Wraps an `LLMClient`; counts chat calls, errors (by cause) and drops per role.

    A failed request becomes an empty completion (the role then drops the sample), but `max_consecutive_errors`
    failures in a row of one kind of request (with tools, without) raise `LLMUnavailable`: a dead server, or
    vLLM refusing every request with tools while it answers the others, would otherwise only show as drops.

    With `context_failures`, a prompt that outgrows the model's context raises `PromptTooLong` instead and does
    not count toward the failures in a row: for a student being measured it is that sample's failure, not a
    server's (`mine`). The generating roles keep the rule above: a teacher that cannot read its prompts is a
    configuration to fix before a run.
    """

    def __init__(
        self,
        client: LLMClient,
        params: SamplingParams,
        max_consecutive_errors: int = 5,
        per_role: dict[str, LLMClient] | None = None,
        context_failures: bool = False,
    ):
        self.client = client
        self.context_failures = context_failures
        self.per_role = per_role or {}
        """A client per role where the role has its own model (`RolesConfig.models`)."""
        self.params = params
        self.max_consecutive_errors = max_consecutive_errors
        self.calls = 0
        self.errors = 0
        self.consecutive: dict[str, int] = {}
        """Failures in a row per kind of request ("tools" / "plain"): a server may refuse only one kind."""
        self.error_causes: dict[str, int] = {}
        self.by_role: dict[str, dict[str, int]] = {}
        """Per role: requests, prompt / completion characters, and tokens where the server returns token ids."""
        self.drops: dict[str, int] = {}

    def answered_in_prose(self, role: str, prose: bool) -> None:
        """Count a role's answer in prose where a tool call was due; `max_consecutive_errors` in a row stop the
        run with one line naming the role and the likely cause (a model that does not call tools, or a server
        that does not parse its calls)."""
        key = f"prose:{role}"
        if not prose:
            self.consecutive[key] = 0
            return
        self.drops[f"{role}:prose"] = self.drops.get(f"{role}:prose", 0) + 1
        self.consecutive[key] = self.consecutive.get(key, 0) + 1
        student = self.context_failures  # a student being measured (`mine`): prose is its failure, not a setup's
        if not student and self.max_consecutive_errors and self.consecutive[key] >= self.max_consecutive_errors:
            raise LLMUnavailable(
                f"datagen stopped: the {role} answered {self.consecutive[key]} requests in a row in prose where a "
                "tool call was due; the model does not call tools, or the server does not parse its calls (vLLM: "
                "--enable-auto-tool-choice --tool-call-parser matching the model, hermes for Qwen2.5/Qwen3; see "
                "experiments/datagen/llm_served.yaml)"
            )

    def fork(self) -> CountingClient:
        """A counter for one item: the same clients and the same failures-in-a-row (shared by the items a worker
        generates at once), its own counts."""
        other = CountingClient(
            self.client, self.params, self.max_consecutive_errors, self.per_role, self.context_failures
        )
        other.consecutive = self.consecutive
        return other

    def chat(self, messages: list[dict], tools: list[dict] | None = None, role: str = "other") -> str:
        self.calls += 1
        use = self.by_role.setdefault(role, dict.fromkeys(USAGE_KEYS, 0))
        use["requests"] += 1
        use["prompt_chars"] += sum(len(m.get("content") or "") for m in messages)
        try:
            out = self.per_role.get(role, self.client).chat([messages], self.params, tools=tools)
        except (LLMError, ValueError, RuntimeError) as err:
            self.errors += 1
            kind = "tools" if tools else "plain"
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            cause = error_cause(message)
            self.error_causes[cause] = self.error_causes.get(cause, 0) + 1
            if self.context_failures and is_context_overflow(message):
                raise PromptTooLong(message) from None
            self.consecutive[kind] = self.consecutive.get(kind, 0) + 1
            if self.max_consecutive_errors and self.consecutive[kind] >= self.max_consecutive_errors:
                raise LLMUnavailable(
                    f"datagen stopped: {self.consecutive[kind]} LLM requests in a row failed; {cause}; "
                    f"last error: {message}"
                ) from None
            return ""
        self.consecutive["tools" if tools else "plain"] = 0
        if out:
            use["completion_chars"] += len(out[0].text or "")
            use["completion_tokens"] += len(out[0].token_ids)
            use["prompt_tokens"] += len(out[0].prompt_token_ids)
        return (out[0].text if out else "") or ""

    def drop(self, role, reason: str) -> None:
        """Record why `role` dropped a sample (its ``last_drop``, counted per role); the role returns None."""
        role.last_drop = reason
        key = f"{role.role}:{reason}"
        self.drops[key] = self.drops.get(key, 0) + 1


class LLMToolMaker:
    name = "llm"
    role = "tool_maker"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.fallback = DeterministicToolMaker()
        self.last_drop: str | None = None

    def make(self, trace, spec, rng: random.Random) -> AdvancedTool | None:
        base = self.fallback.make(trace, spec, rng)
        text = self.llm.chat(tool_maker_messages(trace, base), role=self.role)
        obj = first_json_object(text)
        if obj is None:
            self.llm.drop(self, "no_json")
            return None
        name, description = obj.get("name"), obj.get("description")
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_]\w{0,63}", name)):
            self.llm.drop(self, "bad_name")
            return None
        if not (isinstance(description, str) and 10 <= len(description.strip()) <= 600):
            self.llm.drop(self, "bad_description")
            return None
        return AdvancedTool(name, description.strip(), base.inputs, base.output)


class LLMQueryWriter:
    name = "llm"
    role = "query_writer"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.last_drop: str | None = None

    def write(self, tool: AdvancedTool, trace, spec, rng: random.Random, omit: Sequence[str] = ()) -> Query | None:
        values = {k: v for k, v in tool.inputs.items() if k not in omit}
        criteria = selector_criteria(trace)
        text = self.llm.chat(query_writer_messages(tool, trace, spec, rng.choice(NOISE), omit), role=self.role)
        text = answer_text(text)
        if not (10 <= len(text) <= 2000):
            self.llm.drop(self, "length")
            return None
        # the request must carry every value the user knows (the verifier's own test), or the task is unsolvable
        if not all(stated(v["value"], text, v["param"]) for v in values.values()):
            self.llm.drop(self, "missing_value")
            return None
        if not all(c.split(" of the one with the ")[1] in " ".join(text.lower().split()) for c in criteria):
            self.llm.drop(self, "missing_criterion")
            return None
        if any(re.search(rf"\b{re.escape(name)}\b", text) for name in spec.tool_names if "_" in name or len(name) > 6):
            self.llm.drop(self, "names_tool")
            return None
        return Query(text, list(omit))


class LLMReasoner:
    name = "llm"
    role = "reasoner"

    def __init__(self, llm: CountingClient):
        self.llm = llm

    def act(self, messages, tools, turn, try_index, rng) -> str:
        text = self.llm.chat(reasoner_messages(messages), tools=tools, role=self.role)
        if text and turn.expects_calls and messages and messages[-1]["role"] in ("user", "system"):
            # the first answer to a request that needs the tools: a call, or prose where a call was due
            self.llm.answered_in_prose(self.role, not parse_response(text).calls)
        return text


class LLMCritic:
    name = "llm"
    role = "critic"

    def __init__(self, llm: CountingClient):
        self.llm = llm
        self.last_drop: str | None = None

    def critique(self, turn, attempt_calls, failure, rng) -> str:
        text = self.llm.chat(critic_messages(turn, attempt_calls, failure), role=self.role)
        hint = answer_text(text)[:600]
        if not hint:
            self.llm.drop(self, "empty")
        return hint


# factories named in `role_registry` (``factory(ctx: RoleContext)``)
def tool_maker(ctx) -> LLMToolMaker:
    return LLMToolMaker(ctx.counter)


def query_writer(ctx) -> LLMQueryWriter:
    return LLMQueryWriter(ctx.counter)


def reasoner(ctx) -> LLMReasoner:
    return LLMReasoner(ctx.counter)


def critic(ctx) -> LLMCritic:
    return LLMCritic(ctx.counter)
