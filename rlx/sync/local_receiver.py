"""Start a ``receiver_process`` on this machine and a channel to it; end it by pid.

Used by ``rlx bench-sync`` (its ``process`` target) and the tests. The child binds an ``ipc://``
socket in the temp directory, gets ``--parent-pid`` so it exits if we die, and is stopped with
SIGTERM (SIGKILL after a grace period) by its own pid -- never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator

from rlx.sync.channel import RpcSyncChannel
from rlx.sync.errors import SyncTimeout
from rlx.sync.messages import SyncPing


def start_receiver(
    *extra_args: str, name: str = "receiver process", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """Spawn the receiver process (``env``: variables set for it, e.g. its GPU); return it and its address."""
    address = f"ipc://{tempfile.gettempdir()}/rlx-sync-{os.getpid()}-{secrets.token_hex(4)}.sock"
    cmd = [
        sys.executable,
        "-m",
        "rlx.sync.receiver_process",
        "--address",
        address,
        "--name",
        name,
        "--parent-pid",
        str(os.getpid()),
        *extra_args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **env} if env else None
    )
    return proc, address


def stop_receiver(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """SIGTERM ``proc`` (by pid), SIGKILL it after ``grace_s``; return its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)
    return proc.returncode


async def wait_ready(channel: RpcSyncChannel, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Ping until the receiver answers; fail early if the process exits, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{channel.name} exited with code {proc.returncode} before serving (its stderr is above)"
            )
        try:
            await channel.call(SyncPing(), timeout_s=min(1.0, max(deadline - time.monotonic(), 0.01)))
            return
        except SyncTimeout:
            if time.monotonic() > deadline:
                raise SyncTimeout(f"{channel.name} did not answer a ping within {timeout_s:g} s of starting") from None


@contextlib.asynccontextmanager
async def local_receiver(
    *extra_args: str, name: str = "receiver process", ready_timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[RpcSyncChannel, subprocess.Popen]]:
    """A running receiver process and a channel to it, both ended on exit."""
    proc, address = start_receiver(*extra_args, name=name, env=env)
    channel = RpcSyncChannel.connect(address, name=f"{name} (pid {proc.pid}, {address})")
    try:
        await wait_ready(channel, proc, ready_timeout_s)
        yield channel, proc
    finally:
        channel.close()
        await asyncio.to_thread(stop_receiver, proc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address.removeprefix("ipc://"))
