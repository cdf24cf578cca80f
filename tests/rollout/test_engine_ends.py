"""How a vLLM rollout server ends: an engine core that dies takes the server with it, with an error on every
request; SIGTERM to the server's process group ends the server, its engine core and its workers with exit
code 0 and leaves none of the shared memory they mapped. Real vLLM CPU engines, two started at once (their
start-ups overlap), one for each test to end its own way."""

import asyncio
import os
import signal
import time
from dataclasses import dataclass
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
from tests.launch.test_faults import shm_mapped_by_group

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


@dataclass
class Served:
    address: str
    proc: object
    log: Path


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory) -> dict[str, Served]:
    started: dict[str, Served] = {}
    try:
        for name in ("engine_death", "sigterm"):
            work = tmp_path_factory.mktemp(name)
            config = write_config(work / "serve.yaml", tiny_model_dir, rollout={"backend": "vllm"})
            address, log = f"ipc://{work}/vllm.sock", work / "server.log"
            started[name] = Served(address, start_rlx(["rollout-serve", str(config), "--address", address], log), log)
        for served in started.values():
            wait_ready(served.address, served.proc, served.log)
        yield started
    finally:
        for served in started.values():
            stop_group(served.proc)


def test_a_killed_engine_core_fails_pending_requests_and_stops_the_server(servers):
    served = servers["engine_death"]
    address, proc, log = served.address, served.proc, served.log
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


def live_group_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (an exited child not yet reaped is no process)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_sigterm_ends_the_vllm_server_and_its_engine_processes(servers):
    proc, log = servers["sigterm"].proc, servers["sigterm"].log
    assert len(live_group_members(proc.pid)) >= 3  # the server, the engine core, a worker
    mapped = {path for path in shm_mapped_by_group(proc.pid) if "/psm_" in path}
    assert mapped, "the engine maps no broadcast buffer to check"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)
    assert proc.returncode == 0, log.read_text()[-3000:]
    deadline = time.time() + 30  # the resource tracker unlinks the buffers once the last user is gone
    while time.time() < deadline and (live_group_members(proc.pid) or any(Path(p).exists() for p in mapped)):
        time.sleep(0.2)
    assert not live_group_members(proc.pid), "processes of the server's group outlived it"
    assert not [path for path in mapped if Path(path).exists()], "the engine's shared memory was left behind"
