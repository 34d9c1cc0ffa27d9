"""The shared core's layers import downward only, and the core imports no package.

Layers: ``llm`` < ``rollout`` < ``rl``. Every import of every module under shared/src is read from its
syntax tree (function-level imports too, relative ones resolved), so an import inside a function cannot
hide an upward arrow. A synthetic module with an upward import checks that the checker flags it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = {"llm": 0, "rollout": 1, "rl": 2}
PACKAGES = ("datagen", "egpo", "mars", "aed")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[str, int]]:
    """Every module `source` imports (absolute names) with its line, at any depth of the tree."""
    out = []
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out.append((name, node.lineno))
            # `from palaestra.shared import rl` imports the subpackage: count each name as a module too
            out += [(f"{name}.{alias.name}", node.lineno) for alias in node.names]
    return out


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["palaestra", "shared"] or len(parts) < 3:
        return None
    return LAYERS.get(parts[2])


def problems(module: str, imported: list[tuple[str, int]]) -> list[str]:
    """Each upward import (a layer importing a higher one) and each import of a package, as one line."""
    out: dict[tuple[int, str], str] = {}  # one line per import statement and kind
    own = layer(module)
    for name, line in imported:
        top = name.split(".")
        if top[0] == "palaestra" and len(top) > 1 and top[1] in PACKAGES:
            out.setdefault((line, "package"), f"{module}:{line} imports the package {name}")
        target = layer(name)
        if own is not None and target is not None and target > own:
            where = f"layer {top[2]} is above {module.split('.')[2]}"
            out.setdefault((line, "upward"), f"{module}:{line} imports {name} ({where})")
    return list(out.values())


def check_tree(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        out += problems(module, imports(path.read_text(), module, path.name == "__init__.py"))
    return out


def test_no_upward_import_and_no_package_in_shared():
    modules = list(SRC.rglob("*.py"))
    assert len(modules) > 50  # the walk found the core
    assert check_tree(SRC) == []


def test_checker_flags_an_upward_import(tmp_path):
    """Negative control: a synthetic llm module importing rollout (in a function) and a rollout module
    importing rl (relatively) and a package are all flagged; a downward import is not."""
    llm = tmp_path / "palaestra" / "shared" / "llm"
    rollout = tmp_path / "palaestra" / "shared" / "rollout"
    llm.mkdir(parents=True)
    rollout.mkdir(parents=True)
    (llm / "bad.py").write_text("def f():\n    from palaestra.shared.rollout.engine import RolloutEngine\n")
    (rollout / "bad.py").write_text("from ..rl import trainer\nimport palaestra.mars.games\n")
    (rollout / "good.py").write_text("from palaestra.shared.llm.base import LLMClient\nfrom . import engine\n")
    found = check_tree(tmp_path)
    assert len(found) == 3, found
    assert any("llm.bad:2 imports palaestra.shared.rollout.engine" in line for line in found)
    assert any("rollout.bad:1 imports palaestra.shared.rl" in line for line in found)
    assert any("package palaestra.mars.games" in line for line in found)
