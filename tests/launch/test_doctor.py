"""`rlx doctor` on the local layout (this host, no Ray): a clean layout passes with a real gloo broadcast
measured, a busy rollout port and a GPU that is not there are problems with their fix, and neither
the doctor nor the local launcher imports Ray. The Ray-cluster side is tested in test_ray.py."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.helpers import write_config


def run_doctor(config, *overrides: str) -> subprocess.CompletedProcess:
    code = ("import sys; from typer.testing import CliRunner; from rlx.cli import app; import rlx.launch.launcher; "
            "result = CliRunner().invoke(app, ['doctor', *sys.argv[1:]]); print(result.output); "
            "print('ray imported:', 'ray' in sys.modules); sys.exit(result.exit_code)")
    return subprocess.run([sys.executable, "-c", code, str(config), "--broadcast-mb", "2", *overrides],
                          check=False, capture_output=True, text=True, timeout=120)


def test_doctor_passes_a_local_layout_without_importing_ray(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "local.yaml", tiny_model_dir, rollout={"backend": "hf"})
    result = run_doctor(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gloo broadcast" in result.stdout and "GiB/s" in result.stdout and "no problem found" in result.stdout
    assert "ray imported: False" in result.stdout


def test_doctor_names_a_busy_port_and_a_missing_gpu_with_their_fix(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "local.yaml", tiny_model_dir, rollout={"backend": "hf"})
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_doctor(config, f"rollout.port={port}", "trainer.device=cuda")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"port {port} is taken on this host" in result.stdout, result.stdout
    assert "none is visible here" in result.stdout and "set trainer.device=cpu" in result.stdout, result.stdout
    assert "2 problem(s) found" in result.stdout, result.stdout
