"""What palaestra-datagen registers through its entry points: the jobs ``datagen.generate``, ``datagen.export``,
``datagen.mine`` and the rehearsal of ``datagen.generate``."""

from palaestra.shared.jobs import JOBS
from palaestra.shared.rehearse import REHEARSALS

# lazily: a job's module is imported when the job is looked up
JOBS.register("datagen.generate", "palaestra.datagen.generate:generate")
JOBS.register("datagen.export", "palaestra.datagen.export:export")
JOBS.register("datagen.mine", "palaestra.datagen.mine:mine")
REHEARSALS.register("datagen.generate", "palaestra.datagen.rehearsal:GENERATE")  # `palaestra rehearse`
