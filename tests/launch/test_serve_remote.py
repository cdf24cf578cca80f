"""`rlx rollout-serve --host`: a server for other machines, its token read from the environment, never argv."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from rlx.rollout.client import RolloutServerError
from tests.helpers import stop_group, write_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_with(address: str, token: str):
    from rlx.rollout.client import RolloutClient

    async def go():
        client = RolloutClient([address], token=token, timeout_s=2.0)
        try:
            return await client.health()
        finally:
            client.close()

    return asyncio.run(go())


def test_host_without_a_token_is_refused_naming_the_variable(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("RLX_ROLLOUT_AUTH_TOKEN", raising=False)
    config = write_config(tmp_path / "serve.yaml", tiny_model_dir, rollout={"backend": "hf"})
    runner = CliRunner()
    result = runner.invoke(app, ["rollout-serve", str(config), "--host", "0.0.0.0", "--port", "5999"])
    assert result.exit_code == 2 and "RLX_ROLLOUT_AUTH_TOKEN" in result.output, result.output
    result = runner.invoke(app, ["rollout-serve", str(config), "--host", "0.0.0.0", "--auth-token-env", "MY_TOKEN"])
    assert result.exit_code == 2 and "MY_TOKEN" in result.output, result.output
    result = runner.invoke(app, ["rollout-serve", str(config), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--port" in result.output, result.output
    result = runner.invoke(app, ["rollout-serve", str(config), "--host", "0.0.0.0", "--address", "tcp://0.0.0.0:1"])
    assert result.exit_code == 2 and "pass one of them" in result.output, result.output


@pytest.mark.parametrize("variable", ["RLX_ROLLOUT_AUTH_TOKEN", "MY_TOKEN"])
def test_host_serves_every_interface_with_the_token_from_the_environment(variable, tiny_model_dir, tmp_path):
    token = "tok-" + os.urandom(8).hex()
    config = write_config(tmp_path / "serve.yaml", tiny_model_dir, rollout={"backend": "hf"})
    port = free_port()
    args = ["rollout-serve", str(config), "--host", "0.0.0.0", "--port", str(port)]
    if variable != "RLX_ROLLOUT_AUTH_TOKEN":
        args += ["--auth-token-env", variable]
    env = {k: v for k, v in os.environ.items() if k != "RLX_ROLLOUT_AUTH_TOKEN"}
    env.update({variable: token, "PYTHONUNBUFFERED": "1"})
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlx", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    try:
        address = f"tcp://127.0.0.1:{port}"
        wait_until_healthy(address, token, proc, log)
        with pytest.raises(RolloutServerError, match="auth token"):
            health_with(address, token="wrong")
        assert token not in Path(f"/proc/{proc.pid}/cmdline").read_text()
    finally:
        stop_group(proc)


def wait_until_healthy(address: str, token: str, proc, log, timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            assert health_with(address, token)[0].backend == "hf"
            return
        except RolloutServerError:
            if proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"server not ready ({proc.poll()}):\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)
