"""palaestra.shared: the core every Palaestra package builds on.

config (typed OmegaConf configs), registry, tracking (MLflow), cluster (Ray),
llm (clients and embedded models), toolcall (the tool-use response format),
rollout (text environments and the rollout engine), rewards, rl (advantages,
losses, trainer, SFT), jobs and cli.
"""
