"""`bench_e2e.py --replot` draws saved reports (the README's figures come from it) and refuses reports that
cannot share one figure, naming the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
SCRIPT = ROOT / "benchmarks" / "bench_e2e.py"


def replot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--replot", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_saved_reports_of_two_modes_draw_one_png(tmp_path):
    out = tmp_path / "e2e.png"
    done = replot(
        str(RESULTS / "bench_e2e_quickstart_12seeds_epyc.json"),
        str(RESULTS / "bench_e2e_quickstart_fully_async_12seeds_epyc.json"),
        "--plot",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_reports_of_other_workloads_or_starting_models_are_refused(tmp_path):
    out = tmp_path / "e2e.png"
    mixed = replot(
        str(RESULTS / "bench_e2e_quickstart_12seeds_epyc.json"),
        str(RESULTS / "bench_e2e_long_fully_async_run2_epyc.json"),
        "--plot",
        str(out),
    )
    assert mixed.returncode != 0 and "one workload" in mixed.stderr and "its own --plot" in mixed.stderr
    machines = replot(
        str(RESULTS / "bench_e2e_long_fully_async_run2_epyc.json"),
        str(RESULTS / "bench_e2e_long_fully_async_epyc.json"),
        "--plot",
        str(out),
    )
    assert machines.returncode != 0 and "one starting model" in machines.stderr
    unnamed = replot(str(RESULTS / "bench_e2e_quickstart_12seeds_epyc.json"))
    assert unnamed.returncode == 2 and "add --plot" in unnamed.stderr
    assert not out.exists()
