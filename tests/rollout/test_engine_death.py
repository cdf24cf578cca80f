"""A vLLM engine core that dies takes its rollout server with it, with an error on every request."""

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient, RolloutServerError
from tests.helpers import (
    child_pids,
    group_alive,
    start_rlx,
    stop_group,
    wait_ready,
    write_config,
)

pytestmark = pytest.mark.slow


def engine_core_pid(server_pid: int) -> int:
    """The server's child that runs vLLM's engine core (its other child is multiprocessing's resource tracker)."""
    for pid in child_pids(server_pid):
        if "EngineCore" in Path(f"/proc/{pid}/cmdline").read_text():
            return pid
    raise AssertionError(f"server {server_pid} has no engine-core child among {child_pids(server_pid)}")


def wait_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not group_alive(pgid)


def test_a_killed_engine_core_fails_pending_requests_and_stops_the_server(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "serve.yaml", tiny_model_dir, rollout={"backend": "vllm"})
    address, log = f"ipc://{tmp_path}/vllm.sock", tmp_path / "server.log"
    proc = start_rlx(["rollout-serve", str(config), "--address", address], log)
    try:
        wait_ready(address, proc, log)
        busy = p.SamplingSpec(n=8, temperature=1.0, max_tokens=400)

        async def kill_while_generating() -> str:
            client = RolloutClient([address], timeout_s=120.0)
            try:
                pending = asyncio.create_task(client.generate(["1+1=", "2+2="], busy))
                await asyncio.sleep(1.0)
                assert not pending.done(), "the request finished before the engine could be killed"
                os.kill(engine_core_pid(proc.pid), signal.SIGKILL)
                with pytest.raises(RolloutServerError) as err:
                    await pending
                return str(err.value)
            finally:
                client.close()

        error = asyncio.run(kill_while_generating())
        assert "vLLM engine died" in error, error
        proc.wait(timeout=30)  # a generous bound on noticing the death, not a speed check
        assert proc.returncode == 3, log.read_text()[-3000:]
        assert "vLLM engine died" in log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]  # the death is one line, not vLLM's trace
        assert wait_gone(proc.pid, 30), "processes the server started are still running after it exited"
    finally:
        stop_group(proc)
