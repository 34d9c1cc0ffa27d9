"""What palaestra-egpo registers through its entry points (every group names this module): the jobs ``egpo.eval``,
``egpo.train``, the rewards ``fc_binary``/``fc_multi_turn``, the task source ``fc_tasks``, the env
``bfcl_multi_turn`` and the rehearsal of ``egpo.train``."""

import palaestra.egpo.eval  # noqa: F401  (registers `egpo.eval`)
import palaestra.egpo.reward  # noqa: F401  (registers the `fc_binary` and `fc_multi_turn` rewards)
import palaestra.egpo.train  # noqa: F401  (registers `egpo.train`, the `fc_tasks` source, the `bfcl_multi_turn` env)
from palaestra.shared.rehearse import REHEARSALS

REHEARSALS.register("egpo.train", "palaestra.egpo.rehearsal:TRAIN")  # `palaestra rehearse`
