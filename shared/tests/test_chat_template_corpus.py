"""Token-in-token-out under every original chat template the installed TRL ships (``trl/chat_templates``).

Each template is read from the installed package at test time (never copied) and swapped into `tiny`'s
tokenizer, with the special tokens it names added. A two-seat game runs through the rollout engine with a
scripted policy that answers as a model trained on that template would: its answer, then what the template
puts after an answer up to and including the turn's end token. The oracle is independent of the engine: the
whole conversation rendered by ``apply_chat_template`` at every turn. Each later prompt must hold, token for
token, what the whole render puts after the last answer (the observation included), and the first prompt must
equal the whole render of the first observation. A negative control injects an assembly error (the tail's
last token dropped) and must fail for every family.
"""

from __future__ import annotations

import copy
import importlib.resources
import re

import pytest

from palaestra.shared.llm.base import Completion, LLMClient
from palaestra.shared.rollout import chat_tokens
from palaestra.shared.rollout.engine import EpisodeSpec, RolloutConfig, RolloutEngine
from palaestra.shared.testing import TakeTurns

pytest.importorskip("trl")

MOVES = 6
EPISODES = 2
_TOKEN = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|<｜[^<>｜]{1,40}｜>|<(?:start|end)_of_[a-z_]+>|\[gMASK\]|<sop>|<turn\|>|<\|turn>"
)


def templates() -> dict[str, str]:
    """The original templates (not the ``_training`` patches) by family file name."""
    folder = importlib.resources.files("trl") / "chat_templates"
    return {
        f.name.removesuffix(".jinja"): f.read_text()
        for f in sorted(folder.iterdir(), key=lambda f: f.name)
        if f.name.endswith(".jinja") and "_training" not in f.name
    }


def family_tokenizer(base, template: str):
    tok = copy.deepcopy(base)
    specials = sorted(set(_TOKEN.findall(template)))
    if specials:
        tok.add_special_tokens({"additional_special_tokens": specials})
    if tok.bos_token is None and "bos_token" in template:  # tiny has none; Llama's and Gemma's templates use it
        tok.add_special_tokens({"bos_token": "<bos>"})
    tok.chat_template = template
    return tok


def answer(agent: str, k: int) -> str:
    return f"{agent} plays {k}"


class Duel(TakeTurns):
    """The two seats of `TakeTurns`; each is also told the other's last move."""

    moves = MOVES

    def reset(self, seed=None):
        self.last = None
        return super().reset(seed)

    def observe(self, agent):
        return [{"role": "user", "content": f"you are {agent}; move {self.t}; last {self.last}"}]

    def step(self, action):
        self.last = action.strip()
        return super().step(action)


def observation(agent: str, t: int) -> dict:
    last = None if t == 0 else answer(Duel.agents[(t - 1) % 2], (t - 1) // 2)
    return {"role": "user", "content": f"you are {agent}; move {t}; last {last}"}


NEXT = {"role": "user", "content": "next"}


def whole(tok, history: list[dict]) -> str:
    return tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)


def after_answer(tok, text: str, content: str) -> str:
    """What a model trained on the template generates after `content`: the text up to the turn's end token."""
    rest = text[text.rindex(content) + len(content) :]
    specials = [s for s in tok.all_special_tokens if s and s in rest]
    end = min((rest.index(s) + len(s) for s in specials), default=None)
    if end is None:
        raise AssertionError("the template puts no special token after an answer")
    return rest[:end]


class TemplatePolicy(LLMClient):
    """Answers `answer(agent, k)` followed by the template's turn end (as the template renders it)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, params=None):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            agent = "p1" if "you are p1" in text else "p0"
            k = text.count(f"{agent} plays ")
            # the end of a turn as the whole render writes it after an answer followed by a user message
            probe = [observation(agent, 0), {"role": "assistant", "content": answer(agent, k)}, NEXT]
            end = after_answer(self.tokenizer, whole(self.tokenizer, probe), answer(agent, k))
            ids = self.tokenizer.encode(answer(agent, k) + end, add_special_tokens=False)
            for _ in range(params.n if params else 1):
                out.append(Completion(answer(agent, k), list(ids), [0.0] * len(ids), list(prompt), "stop"))
        return out


def check(tok, trajectories) -> list[str]:
    """The oracle: what differs between each trajectory's prompts and the whole renders (empty: all exact)."""
    problems = []
    for traj in trajectories:
        seat = Duel.agents.index(traj.agent)
        history: list[dict] = []
        for k, turn in enumerate(traj.turns):
            history.append(observation(traj.agent, seat + 2 * k))
            rendered = whole(tok, history)
            if k == 0:
                if turn.prompt_ids != tok.encode(rendered, add_special_tokens=False):
                    problems.append(f"{traj.agent} turn 0: first prompt differs from the whole render")
            else:
                prev = traj.turns[k - 1]
                content = answer(traj.agent, k - 1)
                generated = prev.response_ids[len(tok.encode(content, add_special_tokens=False)) :]
                mine = generated + turn.prompt_ids[len(prev.prompt_ids) + len(prev.response_ids) :]
                want = tok.encode(rendered[rendered.rindex(content) + len(content) :], add_special_tokens=False)
                if turn.prompt_ids[: len(prev.prompt_ids) + len(prev.response_ids)] != prev.prompt_ids + list(
                    prev.response_ids
                ):
                    problems.append(f"{traj.agent} turn {k}: the prompt does not extend the last one")
                if mine != want:
                    problems.append(f"{traj.agent} turn {k}: {tok.decode(mine)!r} != {tok.decode(want)!r}")
            history.append({"role": "assistant", "content": answer(traj.agent, k)})
    return problems


def rollout(tok):
    specs = [EpisodeSpec(Duel, seed=i, group_id=str(i)) for i in range(EPISODES)]
    result = RolloutEngine(TemplatePolicy(tok), RolloutConfig(max_turns=20, max_context_tokens=8192)).run(specs)
    failed = {t.error for t in result.trajectories if t.failed}
    assert not failed, failed
    assert len(result.trajectories) == 2 * EPISODES
    assert all(len(t.turns) == MOVES // 2 for t in result.trajectories)
    return result.trajectories


def test_every_original_template_assembles_exactly(tiny_llm):
    families = templates()
    assert len(families) >= 40, sorted(families)  # 41 in TRL 1.x: about 30 families, some in several revisions
    exact, refused = {}, {}
    for name, template in families.items():
        tok = family_tokenizer(tiny_llm.tokenizer, template)
        try:
            chat_tokens.ChatTokens(TemplatePolicy(tok))
        except ValueError as err:  # refused when the engine is built, in one line
            refused[name] = str(err)
            continue
        trajectories = rollout(tok)
        problems = check(tok, trajectories)
        assert not problems, (name, problems[:3])
        exact[name] = len(trajectories)
    print(f"\n{len(exact)} templates, {sum(exact.values())} trajectories exact; refused: {refused}")
    assert len(exact) >= 38
    # only vision-language templates, which read each message's content as a list of parts, are refused
    assert all(re.search(r"\[['\"](type|text)['\"]\]", families[n]) for n in refused), refused
    assert all("\n" not in line for line in refused.values())


def test_an_assembly_error_is_caught_in_every_family(tiny_llm, monkeypatch):
    """The negative control: a tail missing its last token (the generation prompt's end) fails the oracle."""
    tail = chat_tokens.ChatTokens.tail
    monkeypatch.setattr(chat_tokens.ChatTokens, "tail", lambda self, messages: tail(self, messages)[:-1])
    for name, template in templates().items():
        tok = family_tokenizer(tiny_llm.tokenizer, template)
        try:
            trajectories = rollout(tok)
        except (AssertionError, ValueError):
            continue  # the engine refused the template (or failed its episodes): also caught
        assert check(tok, trajectories), name


THOUGHT = "<think>\nweigh\n</think>\n\nplay"


class Thinker(TemplatePolicy):
    """Answers with a reasoning block first, as Qwen3 does, and stops on ``<|im_end|>``."""

    def generate(self, prompts, params=None):
        out = []
        for prompt in prompts:
            text = THOUGHT
            ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
            out.append(Completion(text, ids, [0.0] * len(ids), list(prompt), "stop"))
        return out


@pytest.mark.parametrize("view", ["generated", "template"])
def test_the_context_option_chooses_the_generated_or_the_templates_view(tiny_llm, view):
    """Qwen3's template drops an earlier turn's <think> when the conversation is rendered whole: ``template``
    shows the policy that view (the whole render, token for token), ``generated`` the tokens it was sampled on."""
    tok = family_tokenizer(tiny_llm.tokenizer, templates()["qwen3"])
    cfg = RolloutConfig(max_turns=4, context=chat_tokens.ContextView(view))
    traj = RolloutEngine(Thinker(tok), cfg).run([EpisodeSpec(Duel, seed=0, group_id="0")]).trajectories[0]
    second = traj.turns[1].prompt_ids
    history = [observation("p0", 0), {"role": "assistant", "content": THOUGHT}]
    history.append({"role": "user", "content": f"you are p0; move 2; last {THOUGHT}"})  # p1 answered the same
    if view == "template":
        assert second == tok.encode(whole(tok, history), add_special_tokens=False)
        assert tok.decode(second).count("weigh") == 1  # in the observation only: the answer's <think> is gone
    else:
        assert second[: len(traj.turns[0].prompt_ids) + len(traj.turns[0].response_ids)] == (
            traj.turns[0].prompt_ids + traj.turns[0].response_ids
        )
        assert tok.decode(second).count("weigh") == 2  # the answer's <think> kept, and the observation
        traj.to_sequence()


def test_a_turn_that_ends_on_another_end_token_keeps_it(tiny_llm):
    """gpt-oss: a model ends its answer with <|return|>; the template re-renders earlier turns with <|end|>. The
    generated context keeps the model's token and adds the rest of the template's tail, nothing twice."""

    class ReturnsPolicy(TemplatePolicy):
        eos_token_ids = None

        def generate(self, prompts, params=None):
            ids = self.tokenizer.encode("play<|return|>", add_special_tokens=False)
            return [Completion("play", ids, [0.0] * len(ids), list(p), "stop") for p in prompts]

    tok = family_tokenizer(tiny_llm.tokenizer, templates()["gptoss"])
    client = ReturnsPolicy(tok)
    client.eos_token_ids = tok.convert_tokens_to_ids(["<|return|>", "<|call|>"])
    traj = RolloutEngine(client, RolloutConfig(max_turns=4)).run([EpisodeSpec(Duel, 0, "0")]).trajectories[0]
    first, second = traj.turns[0], traj.turns[1]
    env_part = tok.decode(second.prompt_ids[len(first.prompt_ids) + len(first.response_ids) :])
    assert env_part.startswith("<|start|>user<|message|>you are p0; move 2")
    assert "<|end|>" not in tok.decode(second.prompt_ids[len(first.prompt_ids) - 1 :]).split("<|start|>user")[0]
