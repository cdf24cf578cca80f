"""scripts/gpu_faults_report.py: a GPU suite's report becomes one row per fault case, a case that failed before
recording its row still gets one (with its error), and a report without the fault probes is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_faults_report.py"
FAULTS = "tests/launch/test_gpu_faults.py::"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


def test_rows_per_case_with_the_reports_gpu_and_commit(tmp_path):
    row = {"case": "sigterm", "phase": "reward", "message": "received SIGTERM", "seconds_to_end": 2.1,
           "leftovers": 0, "resumed": "ok: steps 3..4", "ok": True}  # fmt: skip
    report = {
        "device": "NVIDIA H200",
        "commit": "abc1234",
        "versions": {"vllm": "0.25.1"},
        "command": "python -m pytest -m gpu",
        "tests": {
            FAULTS + "test_sigterm": {"outcome": "passed", "properties": {"fault": row}},
            FAULTS + "test_oom": {"outcome": "failed", "error": "AssertionError: no message"},
            "tests/launch/test_gpu_layouts.py::test_colocated": {"outcome": "passed"},
        },
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    proc = run(str(tmp_path / "report.json"), str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert (out["device"], out["commit"]) == ("NVIDIA H200", "abc1234")
    assert [c["case"] for c in out["cases"]] == ["sigterm", "test_oom"]
    assert out["cases"][0] == {**row, "test": "test_sigterm", "outcome": "passed"}
    assert out["cases"][1]["ok"] is False and "no message" in out["cases"][1]["message"]
    assert "FAIL test_oom" in proc.stdout and "ok   sigterm" in proc.stdout


def test_a_report_without_the_fault_probes_is_refused(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"tests": {"tests/x.py::t": {"outcome": "passed"}}}))
    proc = run(str(tmp_path / "report.json"), str(tmp_path / "out.json"))
    assert proc.returncode == 2 and "holds no test of tests/launch/test_gpu_faults.py" in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_reports_of_several_calls_join_in_order_each_command_kept(tmp_path):
    def report(command: str, case: str) -> dict:
        row = {"case": case, "ok": True}
        return {"device": "NVIDIA H200", "commit": "abc1234", "command": command,
                "tests": {FAULTS + f"test_{case}": {"outcome": "passed", "properties": {"fault": row}}}}  # fmt: skip

    (tmp_path / "a.json").write_text(json.dumps(report("pytest -n 3 -k 'not wake'", "sigterm")))
    (tmp_path / "b.json").write_text(json.dumps(report("pytest -k wake", "wake")))
    proc = run(str(tmp_path / "a.json"), str(tmp_path / "b.json"), str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert [c["case"] for c in out["cases"]] == ["sigterm", "wake"]
    assert out["command"] == ["pytest -n 3 -k 'not wake'", "pytest -k wake"]
    (tmp_path / "c.json").write_text(json.dumps({"tests": {}}))
    proc = run(str(tmp_path / "a.json"), str(tmp_path / "c.json"), str(tmp_path / "out2.json"))
    assert proc.returncode == 2 and "c.json holds no test" in proc.stderr
