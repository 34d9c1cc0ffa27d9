"""The monorepo's packaging rules: five distributions, one PEP 420 namespace, no sibling imports.

A full "install alone into a fresh venv" run is in CI's per-package matrix
(.github/workflows/ci.yml); here we check what makes it work, quickly:
- no ``palaestra/__init__.py`` anywhere (the namespace must stay open);
- every subpackage depends on palaestra-shared (in a version range that holds shared's version) and on no sibling;
- shared's core leaves out what not every user needs (extras), and every distribution has a README of its own;
- every wheel builds and holds only its own subpackage, with its ``py.typed``;
- every module of a subpackage imports with its siblings made unimportable.
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
