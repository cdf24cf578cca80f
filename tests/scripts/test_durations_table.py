"""scripts/durations_table.py reads pytest's own durations section of a real run."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reads_the_durations_section_of_a_real_pytest_run(tmp_path):
    (tmp_path / "test_two.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(0.3)\n\ndef test_fast():\n    pass\n"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=5",
            "--durations-min=0",
            "-o",
            "addopts=",
            str(tmp_path / "test_two.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    log = tmp_path / "run.log"
    log.write_text(run.stdout)
    table = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "durations_table.py"), str(log), "--top", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert table[:2] == ["| s | phase | test |", "|---:|---|---|"]
    (row,) = table[2:]
    seconds, phase, test = (cell.strip() for cell in row.strip("|").split("|"))
    assert phase == "call" and test == "`test_two.py::test_slow`"
    assert float(seconds) >= 0.3


def test_an_output_without_durations_is_refused(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("1 passed in 0.01s\n")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "durations_table.py"), str(log)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "--durations=N" in run.stderr
