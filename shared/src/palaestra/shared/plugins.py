"""What palaestra-shared registers through its entry point: the jobs ``pipeline``, ``llm.generate``, ``rl.train``
and ``rl.sft``."""

import palaestra.shared.jobs  # noqa: F401  (registers `pipeline`)
import palaestra.shared.llm.generate_job  # noqa: F401  (registers `llm.generate`)
import palaestra.shared.rl.jobs  # noqa: F401  (registers `rl.train`, `rl.sft`)
