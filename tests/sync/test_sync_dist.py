"""The gloo broadcast transport against real processes: a receiver SIGKILLed mid-broadcast, a
checksum mismatch, and begin / bucket / end failures on a real `rlx rollout-serve` (hf backend),
each followed by a sync that works."""

import asyncio
import os
import signal
import time

import pytest
import torch

from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from rlx.sync.channel import RpcSyncChannel
from rlx.sync.errors import SyncError
from rlx.sync.messages import SyncBegin, SyncEnd, TransportHandle
from rlx.sync.sender import WeightSender
from tests.helpers import serve_with

SYNC_TIMEOUT_S = 10.0  # generous: a loaded machine starts receivers slowly


def test_receiver_killed_mid_broadcast_is_named_and_the_next_sync_works(spawn_receiver):
    dying, dying_address = spawn_receiver("--hold-s", "0.3", name="dying")
    _, live_address = spawn_receiver(name="live")
    tensors = [(f"w{i}", torch.full((250_000,), float(i))) for i in range(8)]  # 1 MB each, 1 MiB buckets

    async def run():
        dying_ch = RpcSyncChannel.connect(dying_address, name="dying receiver")
        live_ch = RpcSyncChannel.connect(live_address)
        with WeightSender("gloo", bucket_mb=1, timeout_s=SYNC_TIMEOUT_S, verify=True) as sender:
            try:
                assert (await sender.send(tensors, [dying_ch, live_ch])).verified  # both alive
                killer = asyncio.get_running_loop().call_later(0.5, os.kill, dying.pid, signal.SIGKILL)
                start = time.monotonic()
                with pytest.raises(SyncError, match="dying receiver"):
                    await sender.send(tensors, [dying_ch, live_ch])
                elapsed = time.monotonic() - start
                killer.cancel()
                report = await sender.send(tensors, [live_ch])  # the same sender, a new group
                return elapsed, report
            finally:
                dying_ch.close()
                live_ch.close()

    elapsed, report = asyncio.run(run())
    assert dying.wait(10) == -signal.SIGKILL
    assert elapsed < 3 * SYNC_TIMEOUT_S, "the dead receiver was not reported within the deadline"
    assert report.verified and report.num_receivers == 1 and report.num_tensors == len(tensors)


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_a_checksum_mismatch_names_the_tensor_and_the_receiver(receiver_address, monkeypatch, transport):
    import rlx.sync.sender as sender_module

    real = sender_module.tensor_checksum
    monkeypatch.setattr(sender_module, "tensor_checksum", lambda t: real(t) ^ (1 if t.numel() == 3 else 0))

    async def run():
        channel = RpcSyncChannel.connect(receiver_address, name="checked receiver")
        try:
            with WeightSender(transport, bucket_mb=1, timeout_s=30, verify=True) as sender:
                await sender.send([("a", torch.ones(5)), ("b", torch.arange(3.0))], [channel])
        finally:
            channel.close()

    with pytest.raises(SyncError, match=r"checksum mismatch for tensor 'b' on checked receiver"):
        asyncio.run(run())


@pytest.fixture(scope="module")
def hf_server(tiny_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("dist_faults")
    with serve_with(tiny_model_dir, work, "hf", rollout={"backend": "hf"}, sync={"timeout_s": SYNC_TIMEOUT_S}) as (
        address,
        _,
    ):
        yield address


def test_begin_bucket_and_end_failures_leave_the_server_syncing_over_gloo(hf_server, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    weights = [(name, param.detach().contiguous()) for name, param in model.named_parameters()]
    greedy = p.SamplingSpec(n=1, temperature=0.0, max_tokens=4)

    async def scenario(client):
        version = (await client.health())[0].weight_version
        # begin: a group whose sender is not there fails within its timeout, naming the sender
        nobody = TransportHandle(
            "gloo",
            4096,
            2,
            {"host": "127.0.0.1", "port": 9, "group": "g", "rank": 1, "world_size": 2, "timeout_s": 1.0},
        )
        ack = await client.channel(0).call(SyncBegin(7001, nobody, -1, -1, False), 30.0)
        assert not ack.ok and "cannot join the sender at 127.0.0.1:9" in ack.error and not ack.in_sync
        assert (await client.generate(["3+4="], greedy, timeout_s=60))[0].samples
        # bucket: a tensor the model does not have fails its bucket; the group is torn down
        with WeightSender("gloo", bucket_mb=1, timeout_s=SYNC_TIMEOUT_S) as sender, pytest.raises(SyncError):
            await sender.send([("no.such.parameter", torch.zeros(8))], client.channels())
        assert (await client.generate(["3+4="], greedy, timeout_s=60))[0].samples
        # end: fewer tensors than announced; then a verified sync of the whole model over gloo
        with WeightSender("gloo", bucket_mb=1, timeout_s=SYNC_TIMEOUT_S, verify=True) as sender:
            sender_send = sender._call  # the real end, with a wrong count in the begin

            async def miscounted(channel, request, expected):
                if isinstance(request, SyncBegin):
                    request.num_tensors += 1
                return await sender_send(channel, request, expected)

            sender._call = miscounted
            with pytest.raises(SyncError, match="announced"):
                await sender.send(weights, client.channels())
            sender._call = sender_send
            report = await sender.send(weights, client.channels())
        assert report.verified and report.transport == "gloo" and report.num_tensors == len(weights)
        assert (await client.generate(["3+4="], greedy, timeout_s=60))[0].samples
        assert (await client.health())[0].weight_version == version + 1
        stale = await client.channel(0).call(SyncEnd(report.sync_id), 30.0)
        assert not stale.ok and "sync in progress is None" in stale.error  # that sync is over; the server still answers

    async def go():
        client = RolloutClient([hf_server], timeout_s=60.0)
        try:
            await scenario(client)
        finally:
            client.close()

    asyncio.run(go())


@pytest.mark.parametrize("coalesce", [True, False])
def test_buckets_cross_whole_or_chunk_by_chunk_and_land_exactly(spawn_receiver, monkeypatch, coalesce):
    """Coalescing (nccl's way, forced here on gloo): small tensors share a bucket and cross in one broadcast
    of its slot; a tensor larger than a bucket is split and each piece sent from its source. Without it
    (gloo's way), one broadcast per chunk. Both receiver kinds (slot views, and destinations of their own)
    get every byte (checksums), on two syncs in a row."""
    from rlx.sync.transports import dist

    real_init = dist.DistBuffer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.coalesce = coalesce

    monkeypatch.setattr(dist.DistBuffer, "__init__", init)

    posted = []
    real_post_all = dist._post_all
    monkeypatch.setattr(
        dist, "_post_all", lambda group, tensors: posted.append(len(tensors)) or real_post_all(group, tensors)
    )
    _, in_slots = spawn_receiver("--no-assemble-in-place", name="slot receiver")
    _, in_place = spawn_receiver(name="in-place receiver")
    gen = torch.Generator().manual_seed(0)
    tensors = [
        (f"small{i}", torch.randn(1000 + 37 * i, generator=gen).to(dtype))
        for i, dtype in zip(range(60), [torch.float32, torch.bfloat16, torch.float16] * 20, strict=True)
    ]
    tensors += [("empty", torch.empty(0)), ("big", torch.randn(3 * 262_144 + 5, generator=gen))]

    async def run():
        channels = [RpcSyncChannel.connect(a) for a in (in_slots, in_place)]
        try:
            with WeightSender("gloo", bucket_mb=1, timeout_s=SYNC_TIMEOUT_S, verify=True) as sender:
                return [await sender.send(tensors, channels) for _ in range(2)]
        finally:
            for channel in channels:
                channel.close()

    reports = asyncio.run(run())
    assert all(r.verified and r.num_tensors == len(tensors) for r in reports)
    if coalesce:  # one broadcast per bucket: the whole slot, or the one piece of a split tensor
        assert posted == [1] * sum(r.num_buckets for r in reports) and len(posted) < 2 * len(tensors)
    else:  # the chunks of a bucket, one broadcast each
        assert sum(posted) > sum(r.num_buckets for r in reports) and max(posted) > 1


def _counting_groups(monkeypatch) -> list[int]:
    """Count the groups this process (the sender) forms."""
    from rlx.sync.transports import dist

    formed, real = [], dist.new_group

    def counted(*args):
        formed.append(1)
        return real(*args)

    monkeypatch.setattr(dist, "new_group", counted)
    return formed


def test_a_group_serves_every_sync_to_the_same_receivers_and_other_receivers_get_a_new_one(spawn_receiver, monkeypatch):
    formed = _counting_groups(monkeypatch)
    _, a_address = spawn_receiver(name="a")
    _, b_address = spawn_receiver(name="b")
    tensors = [(f"w{i}", torch.full((100_000,), float(i))) for i in range(4)]

    async def run():
        a, b = RpcSyncChannel.connect(a_address, name="a"), RpcSyncChannel.connect(b_address, name="b")
        groups = []
        try:
            with WeightSender("gloo", bucket_mb=1, timeout_s=SYNC_TIMEOUT_S, verify=True) as sender:
                for channels in ([a, b], [a, b], [a, b], [a], [a, b]):
                    tensors[0][1].add_(1.0)  # every sync carries new bytes, checked by the receivers' checksums
                    report = await sender.send(tensors, channels)
                    assert report.verified and report.num_receivers == len(channels)
                    groups.append(len(formed))
        finally:
            a.close()
            b.close()
        return groups

    assert asyncio.run(run()) == [1, 1, 1, 2, 3]


def test_a_receiver_that_lost_the_kept_group_gets_a_new_one_in_the_same_sync(spawn_receiver, monkeypatch):
    import subprocess
    import sys

    from rlx.sync.local_receiver import stop_receiver, wait_ready

    formed = _counting_groups(monkeypatch)
    first, address = spawn_receiver(name="restarting")
    tensors = [("w", torch.arange(1000.0))]
    restarted = []

    async def run():
        channel = RpcSyncChannel.connect(address, name="restarting receiver")
        try:
            with WeightSender("gloo", bucket_mb=1, timeout_s=SYNC_TIMEOUT_S, verify=True) as sender:
                await sender.send(tensors, [channel])
                await sender.send(tensors, [channel])  # the kept group
                os.kill(first.pid, signal.SIGKILL)
                first.wait(10)
                os.unlink(address.removeprefix("ipc://"))
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rlx.sync.receiver_process", "--address", address, "--name", "restarted"],
                    start_new_session=True,
                )
                restarted.append(proc)
                await wait_ready(channel, proc)
                tensors[0][1].add_(1.0)
                start = time.monotonic()
                report = await sender.send(tensors, [channel])  # the restarted receiver does not hold the group
                return time.monotonic() - start, report, await sender.send(tensors, [channel])
        finally:
            channel.close()

    try:
        seconds, report, after = asyncio.run(run())
    finally:
        for proc in restarted:
            stop_receiver(proc)
    assert report.verified and after.verified
    assert seconds < SYNC_TIMEOUT_S / 2, "the lost group was found only at the deadline"
    assert formed == [1, 1]  # the first group served two syncs; the new one the last two
