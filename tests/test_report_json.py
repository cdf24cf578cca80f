"""The suite's ``--report-json`` (tests/conftest.py) under pytest-xdist, as `make test-gpu` and the GPU calls run it
(``-n 4``): one file with every test of every worker, its outcome and recorded properties, written by the
controller alone (workers writing the same file raced each other's swap and failed the session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
import pytest

@pytest.mark.parametrize("k", range(6))
def test_records(k, record_property):
    record_property("k", k)

def test_fails():
    assert False, "on purpose"

def test_skips():
    pytest.skip("not here")
"""


def test_every_workers_tests_land_in_one_report(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    args = ["-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2", "--report-json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_sample.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert proc.returncode == 1, proc.stdout[-3000:]  # the one failing test, nothing else
    report = json.loads(out.read_text())
    assert (report["passed"], report["failed"], report["skipped"]) == (6, 1, 1)
    records = {nodeid: t for nodeid, t in report["tests"].items() if "test_records" in nodeid}
    assert sorted(t["properties"]["k"] for t in records.values()) == list(range(6))
    assert "on purpose" in report["tests"]["test_sample.py::test_fails"]["error"]
    assert not list(tmp_path.glob("report.json.tmp"))
