"""Registry: decorator, duplicates, lazy strings, did-you-mean, entry points, `register_in`, `peek`."""

import sys

import pytest

from palaestra.shared.registry import DuplicateNameError, Registry, UnknownNameError, import_string, register_in


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


def test_register_in_reaches_a_registry_by_its_group_before_and_after_it_exists():
    """`register_in` adds a lazy entry to the registries of an entry-point group without importing their module:
    one created before the call and one created after both see it, and resolve it on `get`."""
    from palaestra.shared import registry as registry_module

    group = "palaestra.test_register_in"
    early: Registry = Registry("thing", group)
    assert "join" not in early
    register_in(group, "join", "os.path:join")
    late: Registry = Registry("thing", group)
    import os.path

    assert early.get("join") is os.path.join and late.get("join") is os.path.join
    assert early.names() == late.names() == ["join"]
    assert "join" not in Registry("thing", "palaestra.another_group")  # control: only that group's registries
    registry_module._DEFERRED.pop(group)


def test_peek_gives_a_lazy_entry_without_importing_it(tmp_path, monkeypatch):
    (tmp_path / "peek_mod_for_test.py").write_text("def impl():\n    '''Does the thing.'''\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry = Registry("thing")
    reg.register("thing", "peek_mod_for_test:impl")
    assert reg.peek("thing") == "peek_mod_for_test:impl"
    assert "peek_mod_for_test" not in sys.modules
    with pytest.raises(UnknownNameError, match="did you mean 'thing'"):
        reg.peek("thin")


def test_job_summary_is_read_from_source_without_importing_the_job(tmp_path, monkeypatch):
    """`palaestra jobs` lists a lazy job's summary from its module's source; the module stays unimported, and the
    summary is the one the imported job gives."""
    from palaestra.shared.jobs import JOBS, job_summary

    (tmp_path / "job_mod_for_test.py").write_text(
        "from palaestra.shared.config import JobConfig\nfrom palaestra.shared.jobs import job\n\n\n"
        "@job('test.summary_job', JobConfig)\ndef run(cfg, tracker):\n    '''Does the thing.\n\n    More.'''\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    JOBS.register("test.summary_job", "job_mod_for_test:run")
    try:
        assert job_summary("test.summary_job") == "Does the thing."
        assert "job_mod_for_test" not in sys.modules
        assert JOBS.get("test.summary_job").summary == "Does the thing."  # imported: the same line
        assert job_summary("test.summary_job") == "Does the thing."
    finally:
        JOBS.unregister("test.summary_job")
        sys.modules.pop("job_mod_for_test", None)
