"""SIGTERM to a vLLM `rlx rollout-serve` process group: the server, its engine core and its workers all
end, with exit code 0, and the shared memory they mapped is gone. Real vLLM CPU engine."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import serve
from tests.launch.test_faults import shm_mapped_by_group

pytestmark = pytest.mark.slow


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


def test_sigterm_ends_the_vllm_server_and_its_engine_processes(tiny_model_dir, tmp_path):
    with serve(tiny_model_dir, "vllm", tmp_path) as (_, proc):
        assert len(live_group_members(proc.pid)) >= 3  # the server, the engine core, a worker
        mapped = {path for path in shm_mapped_by_group(proc.pid) if "/psm_" in path}
        assert mapped, "the engine maps no broadcast buffer to check"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        assert proc.returncode == 0, (tmp_path / "server-vllm.log").read_text()[-3000:]
        deadline = time.time() + 30  # the resource tracker unlinks the buffers once the last user is gone
        while time.time() < deadline and (live_group_members(proc.pid) or any(Path(p).exists() for p in mapped)):
            time.sleep(0.2)
        assert not live_group_members(proc.pid), "processes of the server's group outlived it"
        assert not [path for path in mapped if Path(path).exists()], "the engine's shared memory was left behind"
