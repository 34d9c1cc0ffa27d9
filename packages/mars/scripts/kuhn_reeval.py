"""Exploitability of saved Kuhn checkpoints, read off the model as `mars.eval` does (`palaestra.mars.model_policy`).

    python packages/mars/scripts/kuhn_reeval.py outputs/mars/kuhn_cpu/seed0/checkpoints/step_000030 ...
    python packages/mars/scripts/kuhn_reeval.py --warm-start S    # re-create kuhn_cpu.yaml's warm start for seed S

Prints the exploitability and P(<BET>) at each information state.
"""

from __future__ import annotations

import sys

import torch

from palaestra.mars.model_policy import exploitability, read_policy, response_scorer
from palaestra.shared.llm import LLMConfig, make_client


def report(name: str, client) -> None:
    tabular, table = read_policy(response_scorer(client, 1.0), "kuhn_poker")
    bets = {k: round(v[1], 3) for k, v in sorted(table.items(), key=lambda kv: (len(kv[0]), kv[0]))}
    print(f"{name}: exploitability {exploitability(tabular, 'kuhn_poker'):.4f}; P(<BET>) {bets}", flush=True)


def warm_start(seed: int):
    """kuhn_cpu.yaml's SFT warm start for `seed`: the same tiny initialization, data, batch order and options."""
    from palaestra.shared.matrix import file_combinations
    from palaestra.shared.rl.sft import run_sft

    (combo,) = file_combinations("experiments/mars/kuhn_cpu.yaml", [f"seed={seed}", "arm=rl"])
    cfg = combo.cfg
    client = make_client(cfg.llm)
    run_sft(client.model, client.tokenizer, cfg.sft_warmup)
    return client


if __name__ == "__main__":
    torch.set_num_threads(1)
    args = sys.argv[1:]
    if args[:1] == ["--warm-start"]:
        report(f"warm start, seed {args[1]}", warm_start(int(args[1])))
    else:
        for path in args:
            report(path, make_client(LLMConfig(model=path, device="cpu")))
