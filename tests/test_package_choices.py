"""The packages' fixed choices are refused at resolve time (``palaestra run --dry-run``), not by hand checks in
their jobs: one line naming the key, with the nearest choice where there is one."""

import pytest

from palaestra.shared.config import ConfigError
from palaestra.shared.jobs import load_config


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"job": "aed.victim", "scenario": "higway"},
            "invalid value for 'scenario': unknown scenario 'higway'; did you",
        ),
        ({"job": "aed.attack", "scenarios": ["merj"]}, "invalid value for 'scenarios': unknown scenario 'merj'"),
        ({"job": "aed.attack", "accident_types": ["rear"]}, "invalid value for 'accident_types': unknown accident"),
        ({"job": "aed.attack", "rewards": "expret"}, "invalid value for 'rewards'"),
        ({"job": "aed.victim", "algo": "dqm"}, "did you mean 'dqn'?"),
        ({"job": "datagen.mine", "heldout_fraction": 1.0}, "invalid value for 'heldout_fraction': must be in (0, 1)"),
        ({"job": "datagen.mine", "student": "scriptd"}, "did you mean 'scripted'?"),
        ({"job": "datagen.generate", "roles": {"critic": "oracle"}}, "invalid value for 'roles.critic'"),
        ({"job": "egpo.eval", "decoder": "bfc"}, "did you mean 'bfcl'?"),
        ({"job": "egpo.eval", "policy": "ground_truht"}, "did you mean 'ground_truth'?"),
    ],
)
def test_package_choice_fails_at_resolve(config, message):
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert message in str(err.value) and "\n" not in str(err.value)
