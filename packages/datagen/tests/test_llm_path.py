"""The LLM path end to end: every role through an OpenAI-compatible server that plays a capable model by script.

`ScriptedTeacher` is a small ``http.server`` that answers each role's prompt the way a capable model would,
wrapped the way real models wrap answers (a ``<think>`` block, a preamble, code fences, quotes), so the
roles' parsing is exercised: the tool maker names the composite tool; the query writer states every value it
is given; the reasoner solves the turn from what it has seen (it remembers the calls the tool maker was
shown, as a model that read the whole trace would), asks for a missing value, refuses when a function it
needs is not listed, and on some first tries skips a step, so that the critic's hint is needed; the critic
writes a hint. A second server answers junk: every sample is dropped, under a role's reason.
"""

from __future__ import annotations

import ast
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from palaestra.datagen.dataset import read_rows
from palaestra.datagen.envs import get_env
from palaestra.datagen.grounding import verify_row
from palaestra.shared.config import TrackingConfig


def _parse_call(text: str) -> tuple[str, dict]:
    node = ast.parse(text, mode="eval").body
    return node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}


class ScriptedTeacher(BaseHTTPRequestHandler):
    ops: dict[int, dict] = {}
    queries: dict[str, int] = {}
    requests: dict[str, int] = {}
    judged: dict[str, int] = {}
    slips = True
    """Skip a step on some first tries (the critic's hint fixes it)."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        messages = body["messages"]
        first = messages[0]["content"] or ""
        if first.startswith("You design APIs"):
            reply = self.tool_maker(first)
        elif first.startswith("You write realistic requests"):
            reply = self.query_writer(first)
        elif first.startswith("You review"):
            reply = {"content": "<think>A lookup is missing.</think>Hint: some inputs must be looked up first."}
        elif first.startswith("You judge"):
            reply = self.judge(first)
        else:
            reply = self.reasoner(messages, {t["function"]["name"] for t in body.get("tools") or []})
        prefixes = {"You design": "tool_maker", "You write": "query_writer", "You review": "critic"}
        prefixes["You judge"] = "judge"
        role = next((r for p, r in prefixes.items() if first.startswith(p)), "reasoner")
        type(self).requests[role] = type(self).requests.get(role, 0) + 1
        message = {"role": "assistant", "content": reply.get("content"), "tool_calls": reply.get("tool_calls")}
        if reply.get("thinking"):
            message["reasoning_content"] = reply["thinking"]
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data.encode())))
        self.end_headers()
        self.wfile.write(data.encode())

    def tool_maker(self, text: str) -> dict:
        k = len(self.ops)
        calls = [_parse_call(m) for m in re.findall(r"^\d+\. (.*?) -> ", text, re.M)]
        inputs = [i.strip() for i in text.split("Its inputs will be:")[1].splitlines()[0].split(",")]
        self.ops[k] = {"calls": calls, "inputs": [i for i in inputs if i and i != "none"]}
        obj = {"name": f"composite_op_{k}", "description": f"Runs the whole sequence in one go (op-{k})."}
        return {"content": f"<think>One tool.</think>Here you go:\n```json\n{json.dumps(obj)}\n```"}

    def judge(self, text: str) -> dict:
        """By script: a sample with one call scores 9, with two 3; with more the answer carries no score."""
        n = sum(len(line.split("; ")) for line in re.findall(r"^  calls: (.+)$", text, re.M) if line != "(none)")
        verdict = "none" if n >= 3 else ("low" if n == 2 else "high")
        self.judged[verdict] = self.judged.get(verdict, 0) + 1
        if verdict == "none":
            return {"content": "<think>Hard to say.</think>I cannot tell."}
        return {"content": json.dumps({"score": 3 if verdict == "low" else 9, "reason": "scripted"})}

    def query_writer(self, text: str) -> dict:
        k = int(re.search(r"\(op-(\d+)\)", text).group(1))
        values = text.split("(state every one; strings exactly as written, numbers in any usual form):")[1]
        values = values.splitlines()[0].strip()
        criteria = text.split("(use these words as written):")[1].splitlines()[0].strip()
        noise = re.search(r'remark somewhere: "(.*)"', text).group(1)
        query = (
            f"Hello! Please take care of this for me: {values}. {noise}" if values != "none" else f"Go ahead. {noise}"
        )
        if criteria != "none":
            query = query.replace(f" {noise}", f" Pick {criteria}. {noise}")
        said = values.lower()
        missing = [i for i in self.ops[k]["inputs"] if re.sub(r"_\d+$", "", i).replace("_", " ").lower() not in said]
        self.queries[query] = k
        self.ops[k]["missing"] = missing[0] if missing else None
        return {"content": f'Here is the request: "{query}"'}

    def reasoner(self, messages: list[dict], tools: set[str]) -> dict:
        anchor = max((i for i, m in enumerate(messages) if m["role"] in ("user", "system")), default=0)
        k = None
        for m in reversed(messages):
            if m["role"] == "user" and m["content"].split("\n\n(Hint")[0] in self.queries:
                k = self.queries[m["content"].split("\n\n(Hint")[0]]
                break
        if k is None:
            return {"content": "I am not sure what you need."}
        op = self.ops[k]
        latest = messages[anchor]
        if latest["role"] == "user" and latest["content"].split("\n\n(Hint")[0] in self.queries and op["missing"]:
            words = re.sub(r"_\d+$", "", op["missing"]).replace("_", " ")
            return {"thinking": "A value is missing.", "content": f"Could you tell me the {words}?"}
        if any(name not in tools for name, _ in op["calls"]):
            return {"thinking": "A needed function is missing.", "content": "No available function can do that."}
        done = sum(1 for m in messages[anchor:] if m["role"] == "tool")
        plan = list(op["calls"])
        hinted = "(Hint from a reviewer" in (latest["content"] or "")
        if self.slips and k % 3 == 1 and len(plan) >= 2 and not hinted and latest["role"] == "user":
            plan = plan[1:]  # a capable model's slip on a first try: the critic's hint fixes it
        if done >= len(plan):
            # the results as they came, keys in words ("login status": a flag is reported by its name)
            results = "; ".join(m["content"].replace("_", " ") for m in messages[anchor:] if m["role"] == "tool")
            return {"thinking": "All steps are done.", "content": f"All done. Results: {results}"}  # reports them
        name, args = plan[done]
        call = {"id": f"c{done}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return {"thinking": f"Step {done + 1}: {name} gives what the request needs.", "tool_calls": [call]}


class JunkModel(ScriptedTeacher):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        message = {"role": "assistant", "content": "lorem ipsum {not json"}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data.encode())))
        self.end_headers()
        self.wfile.write(data.encode())


def _serve(handler):
    handler.ops, handler.queries, handler.requests, handler.judged = {}, {}, {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _generate(tmp_path, url, n, envs, **overrides):
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.tracking import Tracker

    llm = LLMConfig(backend="openai", model="scripted", base_url=url, api_key="x", max_retries=0)
    cfg = DataGenerationConfig(
        num_samples=n,
        workers=0,
        envs=envs,
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        roles=RolesConfig(tool_maker="llm", query_writer="llm", reasoner="llm", critic="llm", llm=llm),
        item=ItemConfig(max_turns=2, p_miss_param=0.25, p_miss_func=0.25),
        log_samples=False,
        **overrides,
    )
    result = generate(cfg, Tracker(cfg.tracking))
    return cfg, result, json.loads((cfg.output_path.parent / "stats.json").read_text())


@pytest.fixture
def teacher():
    server = _serve(ScriptedTeacher)
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_every_role_through_a_scripted_capable_model(tmp_path, teacher):
    envs = ["TicketAPI", "TradingBot", "MessageAPI", "VehicleControlAPI"]
    cfg, result, stats = _generate(tmp_path, teacher, 24, envs)
    rows = read_rows(cfg.output_path)
    assert result["kept"] >= 16, stats["drops"]
    assert {"tool_maker", "query_writer", "reasoner", "critic"} <= set(ScriptedTeacher.requests)
    # requests per role as the server counted them, and the per-kept-sample load a target size multiplies
    assert {r: u["requests"] for r, u in stats["llm_usage_by_role"].items()} == ScriptedTeacher.requests
    per = stats["llm_per_kept_sample_by_role"]["reasoner"]["requests"]
    assert per == pytest.approx(ScriptedTeacher.requests["reasoner"] / result["kept"])
    assert stats["llm_errors"] == 0
    assert stats["pass_rate_try_1"] < 1.0 and stats.get("pass_rate_try_2", 0) > 0  # critic hints fixed slips
    for row in rows:
        assert verify_row(row, get_env(row["provenance"]["env"])) == []
        assert row["provenance"]["roles"] == {r: "llm" for r in ("tool_maker", "query_writer", "reasoner", "critic")}
        first = next(t for t in row["turns"] if t["kind"] in ("normal", "miss_param", "miss_func"))
        # the model's request, taken out of its preamble and quotes
        assert first["query"].startswith(("Hello!", "Go ahead.")) and not first["query"].endswith('"')
        assert "Hint from a reviewer" not in json.dumps(row["messages"])
    assert json.loads(rows[0]["provenance"]["advanced_tools"])[0]["name"].startswith("composite_op_")
    kinds = {t["kind"] for r in rows for t in r["turns"]}
    assert {"miss_param", "param_given"} <= kinds or {"miss_func", "func_added"} <= kinds
    assert stats["ungrounded_kept"] == 0 and stats["contamination"]["contaminated"] == 0


def test_junk_answers_are_dropped_per_role(tmp_path):
    server = _serve(JunkModel)
    try:
        _, result, stats = _generate(tmp_path, f"http://127.0.0.1:{server.server_port}/v1", 6, ["MathAPI"])
    finally:
        server.shutdown()
    assert result["kept"] == 0
    assert stats["drops"] == {"tool_maker:no_json": 6}


def test_judge_filter_drops_low_scores(tmp_path, teacher):
    """``roles.judge: llm`` with deterministic roles: the scripted judge scores each verified sample by its number
    of calls (1: 9, 2: 3, more: no score); only samples with one call survive threshold 7, and stats.json counts
    what the server judged."""
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.tracking import Tracker

    llm = LLMConfig(backend="openai", model="scripted", base_url=teacher, api_key="x", max_retries=0)
    cfg = DataGenerationConfig(
        num_samples=24,
        workers=0,
        envs=["TicketAPI", "MathAPI", "GorillaFileSystem"],
        output_dir=str(tmp_path),
        tracking=TrackingConfig(enabled=False),
        roles=RolesConfig(judge="llm", judge_threshold=7, llm=llm),
        item=ItemConfig(max_turns=2),
        log_samples=False,
    )
    result = generate(cfg, Tracker(cfg.tracking))
    stats = json.loads((cfg.output_path.parent / "stats.json").read_text())
    j = ScriptedTeacher.judged
    assert set(ScriptedTeacher.requests) == {"judge"}  # the other roles are deterministic
    assert j.get("high", 0) > 0 and j.get("low", 0) > 0 and j.get("none", 0) > 0, j
    assert stats["judge"]["judged"] == ScriptedTeacher.requests["judge"] == sum(j.values())
    assert stats["drops"]["judge:low_score"] == stats["judge"]["dropped_low_score"] == j["low"]
    assert stats["drops"]["judge:no_score"] == stats["judge"]["dropped_no_score"] == j["none"]
    assert stats["judge"]["passed"] == j["high"] == result["kept"] + stats["duplicates"] + stats["near_duplicates"]
    assert stats["judge"]["scores"] == {"3": j["low"], "9": j["high"]} | ({"none": j["none"]})
    for row in read_rows(cfg.output_path):
        assert sum(len(calls) for calls in row["ground_truth"]) == 1
        assert row["verdict"]["judge_score"] == 9 and row["provenance"]["roles"]["judge"] == "llm"


class SteadyTeacher(ScriptedTeacher):
    """The scripted teacher without first-try slips: it solves each turn as the oracle reasoner does."""

    slips = False


def test_plan_counts_the_requests_a_scripted_run_makes(tmp_path, capsys):
    """`palaestra plan` on an LLM config: the probe's requests per role equal what a scripted run of the same
    items sends (one turn, no slips on either side, the judge on), and the tool maker's prompts are the same
    text; the CLI prints the table."""
    from palaestra.datagen.estimate import estimate_load
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig
    from palaestra.shared.cli import main
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.tracking import Tracker

    server = _serve(SteadyTeacher)
    url = f"http://127.0.0.1:{server.server_port}/v1"
    llm = LLMConfig(backend="openai", model="scripted", base_url=url, api_key="x", max_retries=0)
    roles = RolesConfig(
        tool_maker="llm", query_writer="llm", reasoner="llm", critic="llm", judge="llm", naive_first_try=0.0, llm=llm
    )
    item = ItemConfig(max_turns=1, p_miss_param=0.0, p_miss_func=0.0, p_parallel=0.0)
    envs = ["TicketAPI", "TradingBot", "MessageAPI"]
    cfg = DataGenerationConfig(
        num_samples=12, workers=0, items_per_task=4, envs=envs, output_dir=str(tmp_path), roles=roles, item=item,
        tracking=TrackingConfig(enabled=False), log_samples=False,
    )  # fmt: skip
    estimate = estimate_load(cfg)
    try:
        generate(cfg, Tracker(cfg.tracking))
    finally:
        server.shutdown()
    stats = json.loads((cfg.output_path.parent / "stats.json").read_text())
    assert estimate["probe_items"] == 12 and SteadyTeacher.requests["reasoner"] > 12  # some turns take 2+ calls
    assert {r: u["requests"] for r, u in estimate["probe"].items()} == SteadyTeacher.requests
    assert estimate["probe"]["tool_maker"]["prompt_chars"] == stats["llm_usage_by_role"]["tool_maker"]["prompt_chars"]
    # scaled to a target size: twice the items, twice the requests
    twice = estimate_load(DataGenerationConfig(**{**cfg.__dict__, "num_samples": 24}), probe_items=12)
    assert twice["by_role"]["reasoner"]["requests"] == 2 * SteadyTeacher.requests["reasoner"]

    path = tmp_path / "plan.yaml"
    path.write_text(
        "job: datagen.generate\nnum_samples: 1000\nenvs: [MathAPI]\n"
        "roles: {reasoner: llm, judge: llm, llm: {backend: openai, model: m, base_url: 'http://127.0.0.1:9/v1'}}\n"
    )
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "LLM roles: reasoner, judge" in out and "expected LLM load for 1,000 items" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert set(rows) >= {"reasoner", "judge", "total"} and "tool_maker" not in rows


class SecondModel(ScriptedTeacher):
    """Another served model (its own request counts)."""


def test_a_model_per_role(tmp_path, teacher):
    """``roles.models.critic`` sends the critic's requests to its own server; every other role stays on ``llm``."""
    from palaestra.datagen.generate import DataGenerationConfig, generate
    from palaestra.datagen.pipeline import ItemConfig, RolesConfig
    from palaestra.shared.llm.base import LLMConfig
    from palaestra.shared.tracking import Tracker

    second = _serve(SecondModel)
    try:
        url = f"http://127.0.0.1:{second.server_port}/v1"
        main = LLMConfig(backend="openai", model="scripted", base_url=teacher, api_key="x", max_retries=0)
        critic = LLMConfig(backend="openai", model="second", base_url=url, api_key="x", max_retries=0)
        cfg = DataGenerationConfig(
            num_samples=12,
            workers=0,
            envs=["TicketAPI", "TradingBot"],
            output_dir=str(tmp_path),
            tracking=TrackingConfig(enabled=False),
            roles=RolesConfig(
                tool_maker="llm", query_writer="llm", reasoner="llm", critic="llm", llm=main, models={"critic": critic}
            ),
            item=ItemConfig(max_turns=1, p_miss_param=0.0, p_miss_func=0.0, p_parallel=0.0),
            log_samples=False,
        )
        generate(cfg, Tracker(cfg.tracking))
    finally:
        second.shutdown()
    assert set(SecondModel.requests) == {"critic"} and SecondModel.requests["critic"] > 0
    assert "critic" not in ScriptedTeacher.requests and ScriptedTeacher.requests["reasoner"] > 0


class SlowTeacher(ScriptedTeacher):
    """The scripted teacher, 30 ms per answer, recording how many requests it had in flight at most."""

    lock = threading.Lock()
    in_flight = 0
    most = 0

    def do_POST(self) -> None:
        import time

        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
        try:
            time.sleep(0.03)
            with cls.lock:  # the script's state (ops by index) is shared by the answers
                super().do_POST()
        finally:
            with cls.lock:
                cls.in_flight -= 1


def test_items_at_once_keep_requests_in_flight(tmp_path):
    """``items_at_once: 4``: a worker has several requests in flight; every kept sample still verifies and the
    per-role counts still equal the server's."""
    server = _serve(SlowTeacher)
    SlowTeacher.in_flight = SlowTeacher.most = 0
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        cfg, result, stats = _generate(tmp_path, url, 8, ["TicketAPI", "TradingBot"], items_at_once=4)
    finally:
        server.shutdown()
    assert SlowTeacher.most >= 2
    assert result["kept"] >= 4, stats["drops"]
    for row in read_rows(cfg.output_path):
        assert verify_row(row, get_env(row["provenance"]["env"])) == []
    assert {r: u["requests"] for r, u in stats["llm_usage_by_role"].items()} == SlowTeacher.requests


def test_the_query_writer_is_asked_for_the_users_goal():
    """The prompt names the goal (the trace's last call) and, apart, what it needs that the user asks for."""
    import random

    from palaestra.datagen.envs import ToolEnv, get_env
    from palaestra.datagen.generate import build_graph
    from palaestra.datagen.llm_roles import query_writer_messages
    from palaestra.datagen.phrasing import imperative
    from palaestra.datagen.roles import DeterministicToolMaker
    from palaestra.datagen.sampler import sample_trace

    spec = get_env("TicketAPI")
    graph = build_graph(["TicketAPI"])
    for seed in range(6):
        trace, _ = sample_trace(ToolEnv(spec, seed), graph, "close_ticket", random.Random(seed), 4)
        if not trace.steps:
            continue
        tool = DeterministicToolMaker().make(trace, spec, random.Random(0))
        text = query_writer_messages(tool, trace, spec, "noise")[0]["content"]
        assert f"The user's goal: {imperative(spec.doc(trace.steps[-1].name))}\n" in text
        assert "in your own words" in text and "Steps the user asks for" not in text
