"""A rollout server that dies mid-request gives the client a clear error within its deadline."""

import asyncio
import os
import signal
import time

import pytest

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient, RolloutServerError
from tests.helpers import serve, write_config


@pytest.fixture
def hf_server(tiny_model_dir, tmp_path):
    with serve(tiny_model_dir, "hf", tmp_path) as running:
        yield running


def test_hf_backend_generates_with_logprobs(hf_server):
    address, _ = hf_server

    async def go():
        client = RolloutClient([address])
        try:
            return await client.generate(["3+4=", "1+1="], p.SamplingSpec(n=2, max_tokens=5, seed=0))
        finally:
            client.close()

    results = asyncio.run(go())
    assert [len(r.samples) for r in results] == [2, 2]
    assert all(len(s.logprobs) == len(s.token_ids) > 0 for r in results for s in r.samples)


def test_killed_server_gives_clear_error_within_deadline(hf_server):
    address, proc = hf_server

    async def go():
        client = RolloutClient([address])
        try:
            await client.health()
            os.killpg(proc.pid, signal.SIGKILL)
            started = time.time()
            with pytest.raises(RolloutServerError) as err:
                await client.generate(["3+4="], p.SamplingSpec(max_tokens=4), timeout_s=3.0)
            return time.time() - started, str(err.value)
        finally:
            client.close()

    elapsed, message = asyncio.run(go())
    assert elapsed < 6.0
    assert address in message and "did not answer" in message


def test_non_loopback_bind_is_refused_without_flag_and_token(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from rlx.cli import app

    config = write_config(tmp_path / "serve.yaml", tiny_model_dir, rollout={"backend": "hf"})
    result = CliRunner().invoke(app, ["rollout-serve", str(config), "--address", "tcp://0.0.0.0:5999"])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output
    result = CliRunner().invoke(
        app, ["rollout-serve", str(config), "--address", "tcp://0.0.0.0:5999", "--allow-remote"]
    )
    assert result.exit_code == 2
    assert "auth_token" in result.output
