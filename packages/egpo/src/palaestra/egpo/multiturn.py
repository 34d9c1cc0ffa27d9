"""Multi-turn function calling over BFCL's executable environments, as a `TextEnv`.

One episode is one BFCL multi-turn entry (``multi_turn_base``, ``_miss_func``, ``_miss_param``,
``_long_context``): several user turns on one evolving state of BFCL's environments
(GorillaFileSystem, MathAPI, MessageAPI, TwitterAPI, TicketAPI, TradingBot, TravelAPI,
VehicleControlAPI). It follows BFCL's own inference loop (``base_handler.inference_multi_turn_*``):

- each model response is decoded (`palaestra.shared.toolcall`, or with ``decoder="bfcl"`` BFCL's handler's
  ``decode_execute`` on the response as BFCL stores it, `palaestra.egpo.bfcl_handler`); its calls are executed by
  BFCL's ``execute_multi_turn_func_call`` on this episode's instances and the results come back as ``tool``
  messages; a response with no call (a plain answer, or one that does not decode) ends the user turn, and the
  next user message follows;
- a miss-func turn adds the held-out functions to the user message, as BFCL's prompting mode does
  (the tools in the system prompt are fixed at the first turn);
- more than ``max_steps`` (BFCL: 20) responses in one user turn force-quit the episode (failed);
- at the end, BFCL's ``multi_turn_checker`` replays the decoded calls and the ground truth on fresh
  instances and compares every environment's state and the results after each turn: reward 1.0 if
  valid, else 0.0 (``info["multi_turn_valid"]``, ``info["multi_turn_error"]``); with ``decoder="bfcl"`` the
  verdict is BFCL's runner's on the stored responses (``_evaluate_single_multi_turn_entry``: it decodes them
  again, skipping steps that fail, as ``bfcl evaluate`` does).

BFCL keeps environment instances in its module's globals, keyed by model name and entry id; each
episode uses its own key and removes its instances when it ends (`close`).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from palaestra.egpo.bfcl import load_category, require_bfcl
from palaestra.egpo.tasks import SYSTEM_PROMPT, to_chat_tool
from palaestra.shared.rollout.env import Step, TextEnv
from palaestra.shared.toolcall import call_string

MAX_STEPS_PER_TURN = 20
"""BFCL's MAXIMUM_STEP_LIMIT."""


class BFCLMultiTurnEnv(TextEnv):
    """One BFCL multi-turn entry per episode; reward 1.0 iff BFCL's multi-turn checker accepts it."""

    agents = ["agent"]
    env_type = "bfcl_multi_turn"

    def __init__(
        self,
        entry: dict,
        ground_truth: list[list[str]],
        max_steps: int = MAX_STEPS_PER_TURN,
        decoder: str = "palaestra",
        prompt: str = "palaestra",
        reward_per_turn: bool = False,
        bfcl_model: str | None = None,
    ):
        require_bfcl()
        from palaestra.egpo.bfcl_handler import DEFAULT_MODEL

        self.bfcl_model = bfcl_model or DEFAULT_MODEL
        """The BFCL model key whose handler decodes (``decoder="bfcl"``) and prompts (``prompt="bfcl_prompting"``)."""
        self.reward_per_turn = reward_per_turn
        """Reward each user turn as it ends (1/T if BFCL accepts the episode up to it) instead of 1/0 at the end."""
        self.decoder = decoder
        """palaestra | bfcl: the decode rule of `palaestra.egpo.bfcl_results.decode_calls`."""
        self.prompt = prompt
        """palaestra (our system prompt first) | bfcl_fc (the entry's messages and function docs only) |
        bfcl_prompting (the handler's prompting-mode system prompt in the first turn, no tools)."""
        self.entry = entry
        self.ground_truth = ground_truth
        self.max_steps = max_steps
        self.category = entry["id"].rsplit("_", 1)[0]
        self.long_context = "long_context" in self.category or "composite" in self.category
        self._key: str | None = None
        self.oracle_calls: list[list[tuple[str, dict]]] = []
        """The ground truth per turn as keyword calls, for the eval's oracle (`ground_truth_turn_calls`)."""

    @classmethod
    def from_category(cls, category: str, index: int, **kwargs: Any) -> BFCLMultiTurnEnv:
        entry, truth = load_category(category)[index]
        return cls(entry, truth or [], **kwargs)

    # -- protocol -----------------------------------------------------------
    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.close()
        self._key = f"palaestra_{uuid.uuid4().hex[:12]}"
        self.turn = 0
        self.steps_in_turn = 0
        self.decoded: list[list[list[str]]] = [[]]
        self.responses: list[list[str]] = [[]]
        first = self._user_messages(0)
        if self.prompt == "bfcl_prompting":
            from palaestra.egpo.bfcl_handler import first_turn_messages

            first = first_turn_messages(self.bfcl_model, self.entry["id"], first, self.entry["function"])
        system = [{"role": "system", "content": SYSTEM_PROMPT}] if self.prompt == "palaestra" else []
        self.pending: list[dict] = [*system, *first]
        self.result: dict[str, Any] | None = None
        self._execute([])  # create this episode's instances from the initial config
        return {"id": self.entry["id"], "turns": len(self.entry["question"])}

    def observe(self, agent: str) -> list[dict]:
        messages, self.pending = self.pending, []
        return messages

    def tools(self, agent: str) -> list[dict] | None:
        if self.prompt == "bfcl_prompting":
            return None  # in BFCL's system prompt
        if self.prompt == "bfcl_fc":
            return list(self.entry["function"])
        return [to_chat_tool(doc) for doc in self.entry["function"]]

    def _decode(self, action: str) -> tuple[list[str], list[str], str | None]:
        """(call strings to execute, their names for the tool messages, decode error) of one response."""
        if self.decoder == "bfcl":  # BFCL's inference loop: decode_execute on the stored response
            from palaestra.egpo import bfcl_handler

            stored = bfcl_handler.stored_response(self.bfcl_model, action)
            strings, error = bfcl_handler.execute_calls(self.bfcl_model, stored)
            return strings, strings, error  # BFCL names each tool message by its call string
        from palaestra.egpo.bfcl_results import decode_calls

        decoded, error = decode_calls(action, self.decoder)
        calls = decoded or []
        return [call_string(c.name, c.arguments) for c in calls], [c.name for c in calls], error

    def step(self, action: str) -> Step:
        strings, names, error = self._decode(action)
        self.responses[self.turn].append(action)
        info: dict[str, Any] = {"action": strings, "turn": self.turn}
        if error:
            info["format_error"] = error
        if strings:
            self.decoded[self.turn].append(strings)
            results = self._execute(strings)
            self.pending = [{"role": "tool", "name": n, "content": r} for n, r in zip(names, results)]
            self.steps_in_turn += 1
            if self.steps_in_turn <= self.max_steps:
                return Step(info=info)
            info["force_quit"] = True
            return self._finish(info, force_quit=True)
        # no call: the user turn is over
        self.turn += 1
        self.steps_in_turn = 0
        if self.turn >= len(self.entry["question"]):
            return self._finish(info)
        reward = self._prefix_reward() if self.reward_per_turn else 0.0
        self.decoded.append([])
        self.responses.append([])
        self.pending = self._user_messages(self.turn)
        return Step(rewards={"agent": reward}, info=info)

    # -- helpers ------------------------------------------------------------
    def _user_messages(self, turn: int) -> list[dict]:
        messages = list(self.entry["question"][turn])
        held_out = (self.entry.get("missed_function") or {}).get(str(turn))
        if held_out:
            from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

            text = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=held_out)
            messages = [{"role": "user", "content": text}, *messages]  # BFCL's held-out turns have no question
        return messages

    def _prefix_reward(self) -> float:
        """1/T if BFCL's checker accepts the turns played so far (``self.turn`` of them), else 0."""
        turns = self.turn
        result = check_multi_turn(self.entry, self.decoded[:turns], self.ground_truth[:turns], f"{self._key}_p{turns}")
        return 1.0 / len(self.ground_truth) if result["valid"] else 0.0

    def _execute(self, strings: list[str]) -> list[str]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

        results, _ = execute_multi_turn_func_call(
            strings,
            self.entry.get("initial_config", {}),
            self.entry["involved_classes"],
            self._key,
            self.entry["id"],
            long_context=self.long_context,
            is_evaL_run=False,
        )
        return [str(r) for r in results]

    def _finish(self, info: dict, force_quit: bool = False) -> Step:
        if self.decoder == "bfcl":  # BFCL's runner on what BFCL's result file holds (a force quit: fewer turns)
            from palaestra.egpo.bfcl_handler import score_multi_turn, stored_response

            stored = [[stored_response(self.bfcl_model, t) for t in turn] for turn in self.responses]
            key = f"{self._key}_check"
            try:
                self.result = score_multi_turn(self.bfcl_model, self.entry, stored, self.ground_truth, key)
            finally:
                _drop_instances(key)
        else:
            key = self._key or "palaestra_closed"
            self.result = check_multi_turn(self.entry, self.decoded, self.ground_truth, key, force_quit)
        valid = bool(self.result["valid"])
        info.update(
            multi_turn_valid=valid,
            multi_turn_error=None if valid else self.result.get("error_type"),
            decoded=self.decoded,
            responses=self.responses,  # per user turn, for BFCL's result files (also from a rollout worker)
        )
        self.close()
        reward = (1.0 / len(self.ground_truth) if self.reward_per_turn else 1.0) if valid else 0.0
        return Step(rewards={"agent": reward}, terminated=True, info=info)

    def close(self) -> None:
        """Drop this episode's environment instances from BFCL's module globals."""
        if self._key:
            _drop_instances(self._key)
            self._key = None


def check_multi_turn(
    entry: dict, decoded: list[list[list[str]]], ground_truth: list[list[str]], key: str, force_quit: bool = False
) -> dict:
    """BFCL's verdict on decoded per-turn, per-step call strings (as its eval runner computes it)."""
    require_bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if force_quit or len(decoded) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    checker_key = f"{key}_check"
    try:
        return multi_turn_checker(decoded, ground_truth, dict(entry), entry["id"].rsplit("_", 1)[0], checker_key)
    except Exception as err:  # BFCL's checker asserting on an odd episode is a failed episode, not a crash
        return {"valid": False, "error_type": f"checker_error: {type(err).__name__}: {err}"}
    finally:
        _drop_instances(checker_key)


def _drop_instances(key: str) -> None:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    prefix = re.sub(r"[-./:]", "_", key)
    for name in [n for n in vars(multi_turn_utils) if n.startswith(prefix)]:
        del vars(multi_turn_utils)[name]


def ground_truth_turn_calls(entry: dict, ground_truth: list[list[str]]) -> list[list[tuple[str, dict]]]:
    """The ground truth as keyword calls per turn (positional arguments named by signature)."""
    from palaestra.egpo.bfcl import parse_call_string

    return [[parse_call_string(s, entry["involved_classes"]) for s in turn] for turn in ground_truth]
