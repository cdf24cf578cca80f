"""docs/results/gpu_faults_h200.json from a GPU suite's report: a row per case of tests/launch/test_gpu_faults.py.

    python -m pytest -m gpu tests/launch/test_gpu_faults.py --report-json REPORT
    python scripts/gpu_faults_report.py REPORT [REPORT ...] docs/results/gpu_faults_h200.json

Several reports (the probes split over calls: those that share the GPU under ``pytest -n``, then those that must
be alone on it) join into one file, the cases in the reports' order, each report's command kept.

Each row is what the case recorded (``record_property("fault", ...)``): ``case``, ``phase``, ``message`` (the
first line the user saw), ``seconds_to_end``, ``leftovers`` (0: no process of the run alive, none holding GPU
memory), ``resumed`` and ``ok``, with the test's outcome; the file keeps the report's GPU, commit and versions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FAULTS_FILE = "tests/launch/test_gpu_faults.py"


def fault_rows(report: dict) -> list[dict]:
    rows = []
    for nodeid, test in report.get("tests", {}).items():
        if not nodeid.startswith(FAULTS_FILE):
            continue
        row = (test.get("properties") or {}).get("fault")
        if row is None:
            row = {"case": nodeid.split("::")[-1], "ok": False, "message": test.get("error", "")[-500:]}
        rows.append({**row, "test": nodeid.split("::")[-1], "outcome": test["outcome"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+", help="the --report-json files of GPU suite runs")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.reports]
    rows = []
    for path, report in zip(args.reports, reports, strict=True):
        found = fault_rows(report)
        if not found:
            print(f"{path} holds no test of {FAULTS_FILE}: run it with --report-json", file=sys.stderr)
            return 2
        rows += found
    result = {key: reports[0].get(key) for key in ("device", "commit", "versions")}
    commands = [report.get("command") for report in reports]
    result["command"] = commands[0] if len(commands) == 1 else commands
    result["cases"] = rows
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(f"{'ok  ' if row.get('ok') else 'FAIL'} {row['case']}: {row.get('message', '')[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
