"""The jobs palaestra-shared registers: ``pipeline`` and ``llm.generate``."""

import palaestra.shared.jobs  # noqa: F401  (registers `pipeline`)
import palaestra.shared.llm.generate_job  # noqa: F401  (registers `llm.generate`)
