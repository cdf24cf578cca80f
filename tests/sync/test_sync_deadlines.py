"""Deadlines of the broadcast transport while a peer is stuck inside the collective, over gloo (the
same code runs nccl on GPUs): the sender's event loop never blocks in gloo / NCCL, so a deadline fires
and a signal lands while the peer does not move, and the sync fails naming the peer."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import torch

from rlx.sync.channel import RpcSyncChannel
from rlx.sync.errors import SyncError
from rlx.sync.messages import NO_ID, BucketAck, SyncBegin, SyncBucket, SyncEnd
from rlx.sync.sender import WeightSender

TIMEOUT_S = 3.0


class _Ticks:
    """Counts the event loop's turns while a sync runs: a loop blocked inside a collective counts none."""

    def __init__(self) -> None:
        self.count = 0

    async def run(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0.01)


async def _send_watched(sender: WeightSender, tensors, channels) -> tuple[BaseException, int, float]:
    ticks = _Ticks()
    ticker = asyncio.create_task(ticks.run())
    start = time.monotonic()
    try:
        await sender.send(tensors, channels)
    except SyncError as exc:
        return exc, ticks.count, time.monotonic() - start
    finally:
        ticker.cancel()
    raise AssertionError("the sync to a stuck peer succeeded")


def test_a_receiver_stopped_inside_the_broadcast_fails_the_sync_and_never_blocks_the_loop(spawn_receiver):
    """The receiver joins the group, then is stopped (SIGSTOP) before it posts its side of the bucket:
    the sender's broadcast can never finish. The sync fails naming it, and the event loop turned all along."""
    stuck, address = spawn_receiver(name="stuck receiver")
    tensors = [(f"w{i}", torch.full((1 << 20,), float(i))) for i in range(4)]  # 4 MiB each: gloo cannot buffer them

    async def run():
        channel = RpcSyncChannel.connect(address, name="stuck receiver")
        real_call = channel.call

        async def call(request, timeout_s):
            if isinstance(request, SyncBucket) and request.meta.bucket_id == 0:
                os.kill(stuck.pid, signal.SIGSTOP)  # joined, and now it will not post its broadcast
            return await real_call(request, timeout_s)

        channel.call = call
        try:
            with WeightSender("gloo", bucket_mb=4, timeout_s=TIMEOUT_S) as sender:
                return await _send_watched(sender, tensors, [channel])
        finally:
            channel.close()

    try:
        error, ticks, elapsed = asyncio.run(run())
    finally:
        os.kill(stuck.pid, signal.SIGKILL)  # stopped inside the broadcast: nothing of it is worth a graceful end
    assert "stuck receiver" in str(error)
    assert ticks >= 10, f"the event loop turned {ticks} times during a {elapsed:.1f} s sync: it blocked"


class _JoinsNothing:
    """A receiver that acknowledges every request but never joins the group: the sender's rendezvous waits
    for a rank that never comes."""

    name = "absent receiver"
    address = "ipc://absent"

    async def call(self, request, timeout_s: float) -> BucketAck:
        await asyncio.sleep(0)
        if isinstance(request, (SyncBegin, SyncEnd)):
            return BucketAck(request.sync_id, NO_ID, ok=True, in_sync=isinstance(request, SyncBegin))
        return BucketAck(request.meta.sync_id, request.meta.bucket_id, ok=True, in_sync=True)


def test_a_rendezvous_that_never_forms_fails_within_the_deadline_and_the_next_sync_works(receiver_address):
    tensors = [("w", torch.arange(1000.0))]

    async def run():
        with WeightSender("gloo", bucket_mb=1, timeout_s=TIMEOUT_S) as sender:
            error, ticks, elapsed = await _send_watched(sender, tensors, [_JoinsNothing()])
            channel = RpcSyncChannel.connect(receiver_address, name="live receiver")
            try:  # the lane stuck in the old rendezvous is left behind: the next sync takes a new one
                report = await sender.send(tensors, [channel])
            finally:
                channel.close()
        return error, ticks, elapsed, report

    error, ticks, elapsed, report = asyncio.run(run())
    assert "did not form within" in str(error) and "absent" in str(error)
    assert ticks >= 10, f"the event loop turned {ticks} times during a {elapsed:.1f} s rendezvous: it blocked"
    assert report.num_tensors == 1 and report.transport == "gloo"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lands_while_the_peer_is_stuck(spawn_receiver, signum):
    """A process whose sync waits on a stopped peer still runs its signal handler at once."""
    stuck, address = spawn_receiver(name="stuck receiver")
    tensors = [(f"w{i}", torch.full((1 << 20,), float(i))) for i in range(4)]

    async def run():
        loop = asyncio.get_running_loop()
        channel = RpcSyncChannel.connect(address, name="stuck receiver")
        real_call = channel.call

        async def call(request, timeout_s):
            if isinstance(request, SyncBucket) and request.meta.bucket_id == 0:
                os.kill(stuck.pid, signal.SIGSTOP)
                loop.call_later(0.3, os.kill, os.getpid(), signum)
            return await real_call(request, timeout_s)

        channel.call = call
        task = asyncio.current_task()
        loop.add_signal_handler(signum, task.cancel)
        try:
            with WeightSender("gloo", bucket_mb=4, timeout_s=60.0) as sender:
                start = time.monotonic()
                try:
                    await sender.send(tensors, [channel])
                except asyncio.CancelledError:
                    return time.monotonic() - start
        finally:
            loop.remove_signal_handler(signum)
            channel.close()
        raise AssertionError("the sync to a stopped peer succeeded")

    try:
        elapsed = asyncio.run(run())
    finally:
        os.kill(stuck.pid, signal.SIGKILL)  # stopped inside the broadcast: nothing of it is worth a graceful end
    assert elapsed < 30.0, f"the signal was handled after {elapsed:.1f} s, not before the 60 s deadline"
