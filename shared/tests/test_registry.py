"""Registry: decorator, duplicates, lazy strings, did-you-mean, entry points."""

import pytest

from palaestra.shared.registry import DuplicateNameError, Registry, UnknownNameError, import_string


def test_register_and_get():
    reg = Registry("thing")

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a
    assert reg.names() == ["a"]


def test_duplicate_refused():
    reg = Registry("thing")
    reg.register("a", lambda: 1)
    with pytest.raises(DuplicateNameError, match="'a' is already registered"):
        reg.register("a", lambda: 2)


def test_lazy_string_imported_on_first_get():
    reg = Registry("thing")
    reg.register("join", "os.path:join")
    import os.path

    assert reg.get("join") is os.path.join


def test_module_attr_string_without_registration():
    reg = Registry("thing")
    assert reg.get("json:dumps")([1]) == "[1]"


def test_unknown_name_suggests_nearest():
    reg = Registry("reward")
    reg.register("fc_binary", lambda: 0)
    reg.register("format", lambda: 0)
    with pytest.raises(UnknownNameError) as err:
        reg.get("fc_binry")
    assert str(err.value) == "unknown reward 'fc_binry'; did you mean 'fc_binary'?"


def test_unknown_name_lists_known_when_nothing_is_close():
    reg = Registry("game")
    reg.register("tic_tac_toe", lambda: 0)
    with pytest.raises(UnknownNameError, match="known: tic_tac_toe"):
        reg.get("zzz")


def test_import_string_errors_name_the_path():
    with pytest.raises(ImportError, match="no_such_module"):
        import_string("no_such_module:x")
    with pytest.raises(ImportError, match="has no attribute 'nope'"):
        import_string("json:nope")


def test_entry_point_plugins_register_jobs():
    from palaestra.shared.jobs import JOBS

    # palaestra-shared's own entry point registers llm.generate and pipeline on first lookup
    assert "pipeline" in JOBS.names()
    assert "llm.generate" in JOBS.names()


def test_a_lazy_entry_is_replaced_by_what_its_module_registers(tmp_path, monkeypatch):
    """A plugin names a job lazily ("module:attr"); importing the module registers the object itself (before or
    after the lazy name), and `get` returns that object, not the attribute the string names."""
    (tmp_path / "reg_holder_for_test.py").write_text("REG = None\n")
    (tmp_path / "lazy_mod_for_test.py").write_text(
        "from reg_holder_for_test import REG\n\n\n@REG.register('thing')\ndef impl():\n    return 1\n\n\n"
        "impl_alias = 'not what get returns'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import reg_holder_for_test

    reg: Registry = Registry("thing")
    reg_holder_for_test.REG = reg
    reg.register("thing", "lazy_mod_for_test:impl_alias")
    got = reg.get("thing")  # imports the module, whose decorator registers `impl` in the lazy entry's place
    assert callable(got) and got() == 1 and got.__module__ == "lazy_mod_for_test"
    reg.register("thing", "lazy_mod_for_test:impl")  # the lazy name again, after the module: kept as is
    assert reg.get("thing") is got
    with pytest.raises(DuplicateNameError):  # a name from another module is still a clash
        reg.register("thing", "other_module:impl")
