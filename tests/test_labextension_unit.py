"""The JupyterLab extension's unit tests (labextension/test/, Node's test runner) as part of
the Python suite: `npm test` compiles src/model.ts and the tests and runs them."""

import shutil
import subprocess
from pathlib import Path

import pytest

LABEXTENSION = Path(__file__).resolve().parents[1] / "labextension"


def test_the_typescript_unit_tests_pass():
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("the labextension's unit tests need Node.js and npm on PATH")
    if not (LABEXTENSION / "node_modules" / "typescript").exists():
        # `pip install -e .` installs them; a wheel built elsewhere leaves none here.
        subprocess.run([npm, "install", "--silent"], cwd=LABEXTENSION, check=True)
    run = subprocess.run([npm, "test", "--silent"], cwd=LABEXTENSION, capture_output=True,
                         text=True, timeout=300)
    summary = [line for line in run.stdout.splitlines() if line.startswith("# ")]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "# fail 0" in summary and any(s.startswith("# pass ") and s != "# pass 0"
                                         for s in summary), summary
