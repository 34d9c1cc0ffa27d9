"""What palaestra-aed registers through its entry points (every group names this module): the jobs ``aed.attack``
and ``aed.victim``, their rehearsals, their plans for ``palaestra plan`` (`JOB_PLANS`: CPU-hours and Ray placement,
`palaestra.aed.plan`), and the CPU stand-in LLM backend ``aed_scripted``."""

from palaestra.shared.jobs import JOBS
from palaestra.shared.llm.base import LLM_BACKENDS
from palaestra.shared.plan import JOB_PLANS
from palaestra.shared.rehearse import REHEARSALS

JOBS.register("aed.attack", "palaestra.aed.attack:attack")  # lazily: each job in the module named after it
JOBS.register("aed.victim", "palaestra.aed.victim:victim")
JOBS.register("aed.qualify", "palaestra.aed.qualify:qualify_job")
LLM_BACKENDS.register("aed_scripted", "palaestra.aed.scripted:ScriptedDesigner")
REHEARSALS.register("aed.victim", "palaestra.aed.rehearsal:VICTIM")  # `palaestra rehearse`
REHEARSALS.register("aed.attack", "palaestra.aed.rehearsal:ATTACK")
JOB_PLANS.register("aed.attack", "palaestra.aed.plan:attack_job_plan")  # `palaestra plan`
JOB_PLANS.register("aed.victim", "palaestra.aed.plan:victim_job_plan")
JOB_PLANS.register("aed.qualify", "palaestra.aed.plan:qualify_job_plan")
REHEARSALS.register("aed.qualify", "palaestra.aed.rehearsal:QUALIFY")
