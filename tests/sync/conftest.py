"""Fixtures for weight-sync tests: real receiver processes on ipc:// sockets, ended by pid."""

from __future__ import annotations

import contextlib
import glob
import os

import pytest

from rlx.sync.channel import RpcSyncChannel
from rlx.sync.local_receiver import start_receiver, stop_receiver
from rlx.sync.sender import WeightSender


@pytest.fixture(scope="module")
def receiver_address():
    """A receiver process shared by the tests of one module (each test opens its own channel)."""
    proc, address = start_receiver("--torch-threads", "1", name="test receiver")
    yield address
    stop_receiver(proc)
    _remove_socket(address)


@pytest.fixture
def spawn_receiver():
    """Start extra receiver processes with custom flags; all are ended after the test."""
    procs = []

    def spawn(*args: str, name: str = "test receiver", env: dict | None = None):
        proc, address = start_receiver(*args, name=name, env=env)
        procs.append((proc, address))
        return proc, address

    yield spawn
    for proc, address in procs:
        stop_receiver(proc)
        _remove_socket(address)  # a receiver killed by a test cannot remove it itself


def _remove_socket(address: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address.removeprefix("ipc://"))


@pytest.fixture
def our_segments():
    """Lists this process's shared-memory segments in /dev/shm."""
    return lambda: sorted(glob.glob(f"/dev/shm/rlx-sync-{os.getpid()}-*"))


async def send_twice(tensors, addresses, **sender_kw):
    """Two syncs of ``tensors`` to the receivers at ``addresses`` (the second reuses the buffer)."""
    channels = [RpcSyncChannel.connect(a, name=f"receiver {i}") for i, a in enumerate(addresses)]
    try:
        with WeightSender(**sender_kw) as sender:
            return [await sender.send(tensors, channels) for _ in range(2)]
    finally:
        for channel in channels:
            channel.close()


@pytest.fixture
def sync_send():
    return send_twice
