"""The Makefile's entry points, as the README gives them: `make test PYTEST_ARGS=...` selects the tests."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(*args: str) -> str:
    """The commands `make` would run (`make -n` runs none of them, not even the set-up), as from a shell of its
    own: a suite started by `make test PYTEST_ARGS=...` hands its variables to every make below it (MAKEFLAGS)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTEST_ARGS"}}
    result = subprocess.run(["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, env=env)
    return result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_pytest_args_select_the_tests():
    """Both phases of make test (two processes, then the serial tests) take PYTEST_ARGS after their own flags."""
    commands = _dry_run("test", "PYTEST_ARGS=tests/sync -k layout")
    phases = [line.split("-m pytest", 1)[1].split() for line in commands.splitlines() if "-m pytest" in line]
    assert [args[: args.index("--phase") + 2] for args in phases] == [
        ["-n", "2", "--dist", "loadfile", "--phase", "parallel"],
        ["--phase", "serial"],
    ]
    assert [args[args.index("--phase") + 2 :][:3] for args in phases] == [["tests/sync", "-k", "layout"]] * 2
    whole = [line.split("-m pytest", 1)[1] for line in _dry_run("test").splitlines() if "-m pytest" in line]
    assert [line.split("--phase", 1)[1].split() for line in whole] == [
        ["parallel"],
        ["serial", "||", "[", "$?", "-eq", "5", "]"],
    ]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_quickstart_says_how_to_put_rlx_on_path():
    assert "source .venv/bin/activate" in _dry_run("quickstart")
