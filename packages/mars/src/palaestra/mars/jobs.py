"""Jobs of palaestra-mars (registered through the `palaestra.jobs` entry point)."""

from palaestra.mars import (
    evaluate,  # noqa: F401  (registers mars.eval)
    mas,  # noqa: F401  (registers mars.mas)
    train,  # noqa: F401  (registers mars.train)
)
from palaestra.shared.rehearse import REHEARSALS

REHEARSALS.register("mars.train", "palaestra.mars.rehearsal:TRAIN")  # `palaestra rehearse`
