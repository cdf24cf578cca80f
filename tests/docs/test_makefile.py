"""The Makefile's entry points, as the README gives them: `make test PYTEST_ARGS=...` selects the tests."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(*args: str) -> str:
    """The commands `make` would run (`make -n` runs none of them, not even the set-up)."""
    result = subprocess.run(["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, check=True)
    return result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_pytest_args_select_the_tests():
    commands = _dry_run("test", "PYTEST_ARGS=tests/sync -k layout")
    pytest_line = next(line for line in commands.splitlines() if "-m pytest" in line)
    assert pytest_line.split("-m pytest", 1)[1].split() == ["tests/sync", "-k", "layout"]
    whole = next(line for line in _dry_run("test").splitlines() if "-m pytest" in line)
    assert whole.split("-m pytest", 1)[1].split() == []  # pyproject's testpaths: every test under tests/


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_quickstart_says_how_to_put_rlx_on_path():
    assert "source .venv/bin/activate" in _dry_run("quickstart")
