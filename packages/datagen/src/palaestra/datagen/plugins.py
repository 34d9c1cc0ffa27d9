"""What palaestra-datagen registers through its entry points (every group names this module): the jobs
``datagen.generate``, ``datagen.export``, ``datagen.mine``, the rehearsal of ``datagen.generate`` and its plan
(`JOB_PLANS`: the expected LLM requests and tokens per role, `palaestra.datagen.estimate`)."""

from palaestra.shared.jobs import JOBS
from palaestra.shared.plan import JOB_PLANS
from palaestra.shared.rehearse import REHEARSALS

# lazily: a job's module is imported when the job is looked up
JOBS.register("datagen.generate", "palaestra.datagen.generate:generate")
JOBS.register("datagen.export", "palaestra.datagen.export:export")
JOBS.register("datagen.mine", "palaestra.datagen.mine:mine")
REHEARSALS.register("datagen.generate", "palaestra.datagen.rehearsal:GENERATE")  # `palaestra rehearse`
JOB_PLANS.register("datagen.generate", "palaestra.datagen.estimate:generate_plan")  # `palaestra plan`
