"""House rule: packages plug into the shared trainer through registries and hooks; no package subclasses it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_package_subclasses_the_trainer():
    found = []
    for path in sorted((ROOT / "packages").glob("*/src/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                if any(b == "Trainer" or b.endswith(".Trainer") for b in bases):
                    found.append(f"{path.relative_to(ROOT)}: {node.name}({', '.join(bases)})")
    assert not found, found
