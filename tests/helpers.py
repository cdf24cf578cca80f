"""Test helpers: start real rlx processes in their own process group and end them by pgid."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TEST_ENGINE_MEMORY = 0.05
"""A vLLM engine's share of its GPU in the tests' configs."""
TEST_ENGINE_KV_GB = 0.5
"""A vLLM CPU engine's KV cache in the tests' configs, in GiB of host memory: the tests' prompts need less, several
engines fit side by side, and an explicit size spares the engine its warm-up pass. A fraction would be of the
first NUMA node, less what the engine process holds, which on some hosts leaves a small share nothing."""


def write_config(path: Path, model_dir: Path, **sections) -> Path:
    """A run config with model.path set and any ``section={key: value}`` overrides; a vLLM engine gets
    ``TEST_ENGINE_MEMORY`` and ``TEST_ENGINE_KV_GB`` unless ``rollout`` sets its own."""
    import yaml

    data = {
        "model": {"path": str(model_dir)},
        "logging": {"console": False},
        "rollout": {"gpu_memory_utilization": TEST_ENGINE_MEMORY, "kv_cache_gb": TEST_ENGINE_KV_GB},
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    path.write_text(yaml.safe_dump(data))
    return path


def start_rlx(args: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    from rlx.launch.processes import _term_when_parent_dies

    def child_setup() -> None:
        # as from a terminal: a suite started in the background (``pytest ... &``) inherits SIGINT ignored, and
        # Python then never turns Ctrl-C into KeyboardInterrupt; and SIGTERM if pytest dies without stopping the
        # child (a SIGKILL), as the launcher's children get: it then stops its own children
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _term_when_parent_dies()

    with open(log_path, "w") as log:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "rlx", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=child_setup,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )


def stop_group(proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL what is left, and unlink the /dev/shm files the group mapped
    (a vLLM engine's buffers, its resource tracker's semaphores) that no live process uses, as the launcher
    does for its children (``rlx.launch.leftovers``)."""
    from rlx.launch.leftovers import ShmLeftovers, group_running

    leftovers = ShmLeftovers()
    leftovers.record(proc.pid)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 5.0
    while group_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftovers.remove_unused([proc.pid])


def wait_ready(address: str, proc: subprocess.Popen, log_path: Path, timeout_s: float = 240.0) -> None:
    from rlx.rollout.client import RolloutClient, RolloutServerError

    async def poll() -> None:
        client = RolloutClient([address])
        try:
            deadline = time.time() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
                try:
                    await client.health(timeout_s=2.0)
                    return
                except RolloutServerError:
                    if time.time() > deadline:
                        raise
        finally:
            client.close()

    asyncio.run(poll())


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@contextlib.contextmanager
def serve(model_dir: Path, backend: str, work: Path, env: dict | None = None):
    """A real `rlx rollout-serve` process for ``model_dir``; yields (address, process), ends its group."""
    with serve_with(model_dir, work, f"server-{backend}", env, rollout={"backend": backend}) as served:
        yield served


@contextlib.contextmanager
def serve_with(model_dir: Path, work: Path, name: str, env: dict | None = None, **sections):
    """Like ``serve``, with config ``sections`` (e.g. ``rollout={"backend": "hf"}, sync={...}``)."""
    config = write_config(work / f"{name}.yaml", model_dir, **sections)
    address = f"ipc://{work}/{name}.sock"
    log = work / f"{name}.log"
    proc = start_rlx(["rollout-serve", str(config), "--address", address], log, env)
    try:
        wait_ready(address, proc, log)
        yield address, proc
    finally:
        stop_group(proc)


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid`` (Linux /proc), found by pid, never by name."""
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            pids += [int(c) for c in (task / "children").read_text().split()]
    return pids
