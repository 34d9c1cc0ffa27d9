"""What palaestra-shared registers through its entry point: the jobs ``pipeline``, ``llm.generate``, ``rl.train``
and ``rl.sft``, each in the module named after it (lazily: a job's module, and the torch it may import, loads when
the job is looked up)."""

from palaestra.shared.jobs import JOBS

JOBS.register("pipeline", "palaestra.shared.pipeline:pipeline")
JOBS.register("llm.generate", "palaestra.shared.llm.generate:generate")
JOBS.register("rl.train", "palaestra.shared.rl.train:rl_train")
JOBS.register("rl.sft", "palaestra.shared.rl.sft:rl_sft")
