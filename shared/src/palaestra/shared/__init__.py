"""palaestra.shared: the core every Palaestra package builds on.

config (typed OmegaConf configs, checked at resolve time), config_docs (field help for ``palaestra show``),
registry, extras (optional dependencies), tracking (MLflow), cluster (Ray), llm (clients and embedded models),
toolcall (the tool-use response format), rollout (text environments and the rollout engine), rewards, rl
(advantages, losses, trainer, SFT), stats (confidence intervals), jobs and cli.
"""
