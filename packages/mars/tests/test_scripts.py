"""The package's scripts say where their inputs come from instead of failing with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_compare_equilibria_names_the_mars_clone_when_files_are_missing(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args in ([], [str(tmp_path / "kuhn_cfr.pkl.gz"), str(tmp_path / "leduc_ne.pkl.gz")]):
        run = subprocess.run(
            [sys.executable, str(SCRIPTS / "compare_equilibria.py"), *args], capture_output=True, text=True, env=env
        )
        assert run.returncode == 1 and "Traceback" not in run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "clone of MARS" in lines[0] and "cfr.pkl.gz" in lines[0]
