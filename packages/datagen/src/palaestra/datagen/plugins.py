"""What palaestra-datagen registers through its entry points: the jobs ``datagen.generate``, ``datagen.export``,
``datagen.mine`` and the rehearsal of ``datagen.generate``."""

from palaestra.datagen import export, generate, mine  # noqa: F401  (import registers the jobs)
from palaestra.shared.rehearse import REHEARSALS

REHEARSALS.register("datagen.generate", "palaestra.datagen.rehearsal:GENERATE")  # `palaestra rehearse`
