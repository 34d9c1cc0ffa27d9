"""Replaying a recorded accident: re-simulate it from its record and render a video of the collision.

An accident record (``accidents/<type>.json`` of an ``aed.attack`` child run:
the `AdversarySpec` and the evaluation accidents; or any record from
training) keeps the scenario, the episode's reset seed and the adversaries'
action trace up to the contact. highway-env is deterministic given the reset
seed and the actions (the IDM victim and NPCs are rule-based; an RL victim is
a frozen policy acting deterministically), so resetting with that seed and
replaying the actions reproduces the collision at the same simulation frame.
Rewards do not change the dynamics: the replay runs none.

    python -m palaestra.aed.replay accidents/rear_end.json --index 0 --out rear_end.gif
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from palaestra.aed.adversary import AdversarySpec, make_env


def spec_from(data: dict[str, Any]) -> AdversarySpec:
    known = {f.name for f in fields(AdversarySpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown AdversarySpec field(s) {unknown} in the accident file")
    return AdversarySpec(**data)


def replay(accident: dict[str, Any], spec: AdversarySpec, video: str | Path | None = None, fps: int = 15) -> dict:
    """Re-simulate `accident` under `spec` (its scenario, victim, traffic); return the replayed victim contact
    (``None`` if none happened) and whether it matches the record: same step, time, partner, type."""
    for key in ("seed", "actions", "scenario"):
        if key not in accident:
            raise ValueError(f"accident record has no {key!r}: it was recorded before replays were possible")
    if accident["scenario"] != spec.scenario:
        raise ValueError(f"accident is from scenario {accident['scenario']!r}, the spec is {spec.scenario!r}")
    env = make_env(replace(spec, preference_model=None), render=video is not None, reward_fn=lambda state: 0.0)
    frames: list[np.ndarray] = []
    env.reset(seed=int(accident["seed"]))
    if video is not None:
        frames.append(env.render())
        env.on_frame = frames.append
    contact = None
    for action in accident["actions"]:
        _, _, terminated, truncated, info = env.step(action)
        if "accident" in info:
            contact = info["accident"]
            break
        if terminated or truncated:
            break
    env.close()
    if video is not None and frames:
        import imageio.v2 as imageio

        hold = [frames[-1]] * fps  # the collision stays on screen for a second
        imageio.mimsave(str(video), [np.asarray(f) for f in frames + hold], duration=1.0 / fps, loop=0)
    keys = ("step", "t", "b_role", "accident_type", "striker")
    same = contact is not None and all(contact[k] == accident[k] for k in keys if k in accident)
    return {"contact": contact, "same": bool(same), "frames": len(frames)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m palaestra.aed.replay", description=__doc__.split("\n")[0])
    parser.add_argument("accidents", help="accidents/<type>.json of an aed.attack child run")
    parser.add_argument("--index", type=int, default=0, help="which accident of the file (default 0)")
    parser.add_argument("--out", default="replay.gif", help="video to write (GIF)")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.accidents).read_text())
    accidents = data.get("accidents", [])
    if not 0 <= args.index < len(accidents):
        raise SystemExit(f"--index {args.index} out of range: the file has {len(accidents)} accidents")
    accident = accidents[args.index]
    result = replay(accident, spec_from(data["spec"]), video=args.out)
    if result["contact"] is None:
        raise SystemExit(f"replay of accident {args.index} produced no collision (recorded at step {accident['step']})")
    c = result["contact"]
    print(
        f"{c['accident_type']} at step {c['step']} (t = {c['t']} s) with {c['b_role']}, striker {c['striker']}; "
        f"{'same as recorded' if result['same'] else 'DIFFERS from the record'}; video: {args.out}"
    )
    return 0 if result["same"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
