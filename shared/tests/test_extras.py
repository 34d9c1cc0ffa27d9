"""Optional dependencies: a missing one is a one-line error naming the extra that installs it."""

import sys

import pytest

from palaestra.shared.extras import MissingExtraError, require


def test_missing_module_names_the_extra():
    with pytest.raises(
        MissingExtraError, match=r"^LoRA needs palaestra_absent_mod: pip install 'palaestra-shared\[lora\]'$"
    ):
        require("palaestra_absent_mod", "lora", "LoRA")


def test_a_broken_installed_module_is_not_reported_as_missing(tmp_path, monkeypatch):
    (tmp_path / "palaestra_broken_mod.py").write_text("import palaestra_missing_inner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        require("palaestra_broken_mod", "serve", "x")
    assert not isinstance(err.value, MissingExtraError) and err.value.name == "palaestra_missing_inner"
    sys.modules.pop("palaestra_broken_mod", None)


def test_cluster_without_ray_is_a_one_line_cli_error(monkeypatch, capsys):
    from palaestra.shared import cli, cluster

    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'palaestra-shared\[ray\]'"):
        cluster.init()
    assert issubclass(MissingExtraError, cli._user_errors())
