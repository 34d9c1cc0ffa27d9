"""What palaestra-egpo registers through its entry points (every group names this module): the jobs ``egpo.eval``,
``egpo.train``, the rewards ``fc_binary``/``fc_binary_lenient``/``fc_multi_turn``, the task sources ``fc_tasks``
and ``public_fc_tasks``, the envs ``bfcl_multi_turn`` and ``datagen_multi_turn``, and the rehearsal of
``egpo.train``.

All lazily (``"module:attr"``): a module is imported when its entry is looked up, so listing jobs imports none of
them (``egpo.train`` imports the trainer's torch); importing a module registers the same objects itself.
"""

from palaestra.shared.jobs import JOBS
from palaestra.shared.rehearse import REHEARSALS
from palaestra.shared.rewards import REWARDS
from palaestra.shared.rollout.env import ENVS
from palaestra.shared.rollout.tasks import TASKS

JOBS.register("egpo.eval", "palaestra.egpo.eval:evaluate")
JOBS.register("egpo.train", "palaestra.egpo.train:train")
REWARDS.register("fc_binary", "palaestra.egpo.reward:fc_binary")
REWARDS.register("fc_binary_lenient", "palaestra.egpo.reward:fc_binary_lenient")
REWARDS.register("fc_multi_turn", "palaestra.egpo.reward:fc_multi_turn")
TASKS.register("fc_tasks", "palaestra.egpo.fc_tasks:fc_tasks")
TASKS.register("public_fc_tasks", "palaestra.egpo.public_data:public_fc_tasks")
ENVS.register("bfcl_multi_turn", "palaestra.egpo.train:bfcl_multi_turn")
ENVS.register("datagen_multi_turn", "palaestra.egpo.multiturn_data:datagen_multi_turn")
REHEARSALS.register("egpo.train", "palaestra.egpo.rehearsal:TRAIN")  # `palaestra rehearse`
