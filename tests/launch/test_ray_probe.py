"""`rlx train launcher=ray` and `rlx doctor` on an address where no Ray cluster answers: one error line
naming the key and the fix, at once, instead of ray.init's minutes of retries. Real processes, real sockets;
the real-cluster side (an address that answers) is tested in test_ray.py."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.helpers import start_rlx, stop_group, write_config

pytest.importorskip("ray")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port that accepts connections and never says a word (as another service's port might)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in accepted:
        conn.close()


def run(tmp_path, model_dir, command: str, *overrides: str, env: dict | None = None) -> tuple[int, str]:
    config = write_config(
        tmp_path / "run.yaml",
        model_dir,
        launcher="ray",
        rollout={"backend": "hf"},
        trainer={"output_dir": str(tmp_path / "run")},
    )
    log = tmp_path / f"{command}.log"
    proc = start_rlx([command, str(config), *overrides], log, env)
    try:
        proc.wait(120)  # without the check, ray.init retried for about 13 minutes
    finally:
        stop_group(proc)
    return proc.returncode, " ".join(log.read_text().split())


@pytest.mark.parametrize("command", ["train", "doctor"])
def test_an_address_that_refuses_is_named_with_the_fix(tiny_model_dir, tmp_path, command):
    port = closed_port()
    code, output = run(tmp_path, tiny_model_dir, command, f"ray.address=127.0.0.1:{port}")
    assert code == 2, output[-3000:]
    assert f"error: ray.address='127.0.0.1:{port}': cannot connect to 127.0.0.1:{port}" in output, output[-3000:]
    assert "leave ray.address empty to start a local Ray instance" in output
    assert "Traceback" not in output


def test_a_port_that_is_not_a_ray_cluster_is_named(tiny_model_dir, tmp_path, silent_port):
    code, output = run(tmp_path, tiny_model_dir, "doctor", env={"RAY_ADDRESS": f"ray://127.0.0.1:{silent_port}"})
    assert code == 2, output[-3000:]
    assert (
        f"error: RAY_ADDRESS='ray://127.0.0.1:{silent_port}': 127.0.0.1:{silent_port} accepts connections but "
        "does not answer as a Ray cluster (a gRPC server) does" in output
    ), output[-3000:]
    assert "leave RAY_ADDRESS empty" in output
