"""The monorepo's packaging rules: five distributions, one PEP 420 namespace, no sibling imports.

A full "install alone into a fresh venv" run is in CI's per-package matrix
(.github/workflows/ci.yml); here we check what makes it work, quickly:
- no ``palaestra/__init__.py`` anywhere (the namespace must stay open);
- every subpackage depends on palaestra-shared (in a version range that holds shared's version) and on no sibling;
- shared's core leaves out what not every user needs (extras), and every distribution has a README of its own;
- every wheel builds and holds only its own subpackage, with its ``py.typed``;
- every module of a subpackage imports with its siblings made unimportable;
- every entry-point group of a distribution names its one `plugins` module, installed as declared, none broken.
"""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["datagen", "egpo", "mars", "aed"]
DISTS = {"shared": ROOT / "shared", **{p: ROOT / "packages" / p for p in PACKAGES}}


def test_namespace_has_no_init():
    for path in DISTS.values():
        assert not (path / "src" / "palaestra" / "__init__.py").exists(), path
        assert (path / "src" / "palaestra").is_dir()


@pytest.mark.parametrize("name", PACKAGES)
def test_depends_on_shared_and_no_sibling(name):
    meta = tomllib.loads((DISTS[name] / "pyproject.toml").read_text())["project"]
    deps = [d.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip() for d in meta["dependencies"]]
    assert meta["name"] == f"palaestra-{name}"
    assert "palaestra-shared" in deps
    assert not [d for d in deps if d.startswith("palaestra-") and d != "palaestra-shared"]


@pytest.mark.parametrize("name", PACKAGES)
def test_shared_dependency_is_bounded_and_holds_shared(name):
    from packaging.requirements import Requirement

    shared_version = tomllib.loads((DISTS["shared"] / "pyproject.toml").read_text())["project"]["version"]
    meta = tomllib.loads((DISTS[name] / "pyproject.toml").read_text())["project"]
    (req,) = [Requirement(d) for d in meta["dependencies"] if Requirement(d).name == "palaestra-shared"]
    assert req.specifier.contains(shared_version)
    assert any(s.operator == "<" for s in req.specifier), f"{name}: no upper bound on palaestra-shared"


def test_shared_core_leaves_optional_stacks_to_extras():
    from packaging.requirements import Requirement

    meta = tomllib.loads((DISTS["shared"] / "pyproject.toml").read_text())["project"]
    core = {Requirement(d).name for d in meta["dependencies"]}
    extras = meta["optional-dependencies"]
    for extra, package in [("ray", "ray"), ("serve", "fastapi"), ("openai", "openai"), ("lora", "peft")]:
        assert package not in core
        assert package in {Requirement(d).name for d in extras[extra]}
    assert "bfcl-eval" not in str(meta)


@pytest.mark.parametrize("name", list(DISTS))
def test_each_distribution_has_its_own_readme_and_py_typed(name):
    meta = tomllib.loads((DISTS[name] / "pyproject.toml").read_text())["project"]
    readme = DISTS[name] / meta["readme"]
    assert len(readme.read_text().splitlines()) >= 20, f"{readme} is too short to stand on its own"
    assert (DISTS[name] / "src" / "palaestra" / name / "py.typed").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DISTS))
def test_wheel_builds_with_only_its_own_package(name, tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(DISTS[name]),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    code = [f for f in files if f.startswith("palaestra/")]
    assert "palaestra/__init__.py" not in files
    assert code and all(f.startswith(f"palaestra/{name}/") for f in code), code[:5]
    assert f"palaestra/{name}/py.typed" in files


BLOCK_SIBLINGS = """
import importlib, pkgutil, sys
own = sys.argv[1]
siblings = {"datagen", "egpo", "mars", "aed"} - {own}

class Blocker:
    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if len(parts) > 1 and parts[0] == "palaestra" and parts[1] in siblings:
            raise ImportError(f"palaestra.{own} imports its sibling {name}")
        return None

sys.meta_path.insert(0, Blocker())
package = importlib.import_module(f"palaestra.{own}")
for info in pkgutil.walk_packages(package.__path__, prefix=f"palaestra.{own}."):
    importlib.import_module(info.name)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKAGES)
def test_imports_without_siblings(name):
    out = subprocess.run([sys.executable, "-c", BLOCK_SIBLINGS, name], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def _entry_point_groups(name: str) -> dict[str, dict[str, str]]:
    return tomllib.loads((DISTS[name] / "pyproject.toml").read_text())["project"].get("entry-points", {})


@pytest.mark.parametrize("name", list(DISTS))
def test_every_entry_point_group_names_the_plugins_module(name):
    """One home per distribution for what it adds to the registries: ``palaestra.<name>.plugins`` (issue 24)."""
    groups = _entry_point_groups(name)
    assert "palaestra.jobs" in groups, f"{name}: no palaestra.jobs entry point"
    for group, entries in groups.items():
        assert group.startswith("palaestra."), group
        for ep_name, value in entries.items():
            assert value == f"palaestra.{name}.plugins", f"{name}: [{group}] {ep_name} = {value!r}"
    assert (DISTS[name] / "src" / "palaestra" / name / "plugins.py").is_file()
    assert not (DISTS[name] / "src" / "palaestra" / name / "builtin_jobs.py").exists()


@pytest.mark.parametrize("name", list(DISTS))
def test_installed_entry_points_are_the_pyproject_ones(name):
    """The installed metadata is not stale (after editing entry points: ``pip install --no-deps -e``)."""
    from importlib.metadata import distribution

    installed: dict[str, dict[str, str]] = {}
    for ep in distribution(f"palaestra-{name}").entry_points:
        if ep.group.startswith("palaestra."):
            installed.setdefault(ep.group, {})[ep.name] = ep.value
    assert installed == _entry_point_groups(name)


def test_every_registry_loads_its_plugins_without_a_broken_one():
    from palaestra.datagen.envs import API_ENVS
    from palaestra.shared.jobs import JOBS
    from palaestra.shared.llm.base import LLM_BACKENDS
    from palaestra.shared.llm.tiny import TOKEN_SETS
    from palaestra.shared.plan import EVAL_COSTS, JOB_PLANS
    from palaestra.shared.rewards import REWARDS
    from palaestra.shared.rl.advantages import ADVANTAGES
    from palaestra.shared.rl.batch_rules import BATCH_RULES
    from palaestra.shared.rollout.env import ENVS
    from palaestra.shared.rollout.tasks import TASKS

    registries = [
        JOBS,
        ENVS,
        TASKS,
        LLM_BACKENDS,
        TOKEN_SETS,
        EVAL_COSTS,
        JOB_PLANS,
        BATCH_RULES,
        ADVANTAGES,
        REWARDS,
        API_ENVS,
    ]
    for reg in registries:
        assert reg.broken_plugins() == {}, reg.kind
    # one name per group from each distribution that adds to it (the groups its pyproject lists)
    assert {"aed.attack", "aed.victim", "datagen.generate", "egpo.train", "mars.train", "rl.train"} <= set(JOBS.names())
    assert "aed_scripted" in LLM_BACKENDS.names()
    assert {"aed.attack", "aed.victim"} <= set(JOB_PLANS.names())
    assert "mars_board_actions" in TOKEN_SETS.names()
    assert {"mars_game", "bfcl_multi_turn"} <= set(ENVS.names())
    assert {"mars_legal_moves", "fc_tasks"} <= set(TASKS.names())
    assert "first_finished" in BATCH_RULES.names() and "mars.train" in EVAL_COSTS.names()
    assert {"fc_binary", "fc_multi_turn"} <= set(REWARDS.names())
