"""`rlx doctor`'s gpu stack row: on a CUDA host it says whether the installed packages are the stack the GPU suite
ran (constraints/gpu.txt), naming each package that differs with its tested version; on a CPU host that the pins
do not apply. Checked against a small constraints file and made-up installed versions: no GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlx.launch import doctor, tested_stack
from rlx.launch.tested_stack import installed_versions, read_pins, stack_row

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3


@pytest.fixture
def constraints(tmp_path, monkeypatch):
    path = tmp_path / "gpu.txt"
    path.write_text("# the stack that ran\nvllm==0.25.1\ntorch == 2.11.0  # CUDA 13\n\nLiger-Kernel==0.8.5\n")
    monkeypatch.setattr(tested_stack, "CONSTRAINTS", path)
    return path


def test_pins_are_read_from_the_constraints_file(constraints):
    assert read_pins() == {"vllm": "0.25.1", "torch": "2.11.0", "liger-kernel": "0.8.5"}
    assert read_pins(constraints.parent / "absent.txt") == {}


def test_a_cuda_host_with_the_tested_stack_matches(constraints):
    installed = {"vllm": "0.25.1", "torch": "2.11.0+cu130", "liger-kernel": "0.8.5"}  # a local tag matches, as in pip
    row = stack_row(read_pins(), installed, gpus=1)
    assert row == "matches the tested GPU stack: vllm 0.25.1, torch 2.11.0, liger-kernel 0.8.5"


def test_a_cuda_host_that_differs_names_each_package_and_its_tested_version(constraints):
    installed = {"vllm": "0.32.0", "torch": "2.13.0", "liger-kernel": "missing"}
    row = stack_row(read_pins(), installed, gpus=2)
    assert row.startswith(
        "differs from the tested GPU stack: vllm 0.32.0 (tested 0.25.1), torch 2.13.0 (tested 2.11.0), "
        "liger-kernel missing (tested 0.8.5); pip install -c constraints/gpu.txt 'rlx[gpu]' installs what ran"
    ), row
    one = stack_row(read_pins(), {**installed, "torch": "2.11.0", "liger-kernel": "0.8.5"}, gpus=1)
    assert "vllm 0.32.0 (tested 0.25.1)" in one and "torch" not in one.split(";")[0]


def test_a_cpu_host_is_told_the_gpu_pins_do_not_apply(constraints):
    assert "do not apply" in stack_row(read_pins(), {"vllm": "0.32.0"}, gpus=0)


def test_doctor_gathers_each_pinned_package_and_prints_the_row(constraints, tmp_path, monkeypatch):
    from importlib.metadata import version

    from rlx.config import load_config
    from tests.helpers import write_config

    pins = tmp_path / "mine.txt"
    pins.write_text("msgspec==0.0.1\nno-such-package-rlx==1.0\n")
    monkeypatch.setattr(tested_stack, "CONSTRAINTS", pins)
    gathered = installed_versions(list(read_pins()))
    assert gathered == {"msgspec": version("msgspec"), "no-such-package-rlx": "missing"}

    cfg = load_config(str(write_config(tmp_path / "run.yaml", tmp_path / "model", rollout={"backend": "hf"})), [])
    facts = {"python": "3.12", "torch": "2.11.0", "vllm": "missing", "rlx": "0", "gpus": 1, "gpu_free": [GIB]}
    facts |= {"mem_available": GIB, "shm_free": GIB, "shm_total": GIB, "ports_in_use": [], "gpu_stack": gathered}
    checks = doctor.node_checks(cfg, "this host", facts, {"trainer": 1}, {"trainer": 0}, want_gpu=False)
    (row,) = [c for c in checks if c.what == "gpu stack"]
    assert f"msgspec {version('msgspec')} (tested 0.0.1)" in row.found, row.found
    assert "no-such-package-rlx missing (tested 1.0)" in row.found and row.ok  # reported, not refused


def test_the_shipped_constraints_pin_what_the_gpu_suite_recorded():
    recorded = json.loads((ROOT / "docs/results/gpu_tests.json").read_text())["versions"]
    assert read_pins(ROOT / "constraints" / "gpu.txt") == recorded
    assert tested_stack.CONSTRAINTS == ROOT / "constraints" / "gpu.txt"
