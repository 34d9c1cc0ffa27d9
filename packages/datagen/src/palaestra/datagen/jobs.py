"""Jobs of palaestra-datagen (registered through the `palaestra.jobs` entry point)."""

from palaestra.datagen import export, generate, mine  # noqa: F401  (import registers the jobs)
from palaestra.shared.rehearse import REHEARSALS

REHEARSALS.register("datagen.generate", "palaestra.datagen.rehearsal:GENERATE")  # `palaestra rehearse`
