"""Sender -> receiver process round trips over real ZeroMQ sockets, through shared memory and
through a real gloo process group (the cross-host transport, here between local processes)."""

import asyncio
import os
import signal
import time

import pytest
import torch

from rlx.sync.errors import SyncError, SyncTimeout
from rlx.sync.sender import WeightSender


def tiny_state_dict(model_dir) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    tensors = list(model.state_dict().items())
    # one tensor over 1 MiB so that bucket_mb=1 splits it across slots, plus odd shapes and dtypes
    tensors += [
        ("extra.big", torch.randn(700_000)),
        ("extra.bf16", torch.randn(33, 7).to(torch.bfloat16)),
        ("extra.scalar", torch.tensor(2.5)),
        ("extra.empty", torch.empty(0, 3)),
        ("extra.int", torch.arange(1000, dtype=torch.int64)),
    ]
    return tensors


TRANSPORTS = ["shm", "gloo"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("num_buffers", [1, 2], ids=["lock-step", "double-buffered"])
def test_tiny_model_round_trip_with_checksums(
    tiny_model_dir, receiver_address, num_buffers, transport, our_segments, sync_send
):
    tensors = tiny_state_dict(tiny_model_dir)
    reports = asyncio.run(
        sync_send(
            tensors,
            [receiver_address],
            bucket_mb=1,
            num_buffers=num_buffers,
            verify=True,
            timeout_s=30,
            transport=transport,
        )
    )
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    for report in reports:
        assert report.verified and report.num_tensors == len(tensors) and report.total_bytes == total
        assert report.num_buckets >= 3  # the big tensor alone spans more than one slot
    assert our_segments() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_streamed_tensors_and_two_receivers_get_the_same_bytes(
    tiny_model_dir, receiver_address, spawn_receiver, sync_send, transport
):
    tensors = tiny_state_dict(tiny_model_dir)
    _, second = spawn_receiver(name="second receiver")
    reports = asyncio.run(
        sync_send(
            iter(tensors), [receiver_address, second], bucket_mb=1, verify=True, timeout_s=60, transport=transport
        )
    )
    assert reports[0].num_receivers == 2 and reports[0].verified
    assert reports[0].num_tensors == len(tensors)


def test_slot_is_never_overwritten_before_its_ack(spawn_receiver, sync_send):
    # the receiver holds every bucket 50 ms, then checks the slot bytes it was handed are unchanged
    _, address = spawn_receiver("--hold-s", "0.05", "--check-intact")
    tensors = [(f"w{i}", torch.full((200_000,), float(i))) for i in range(12)]  # 0.8 MB each, 1 MiB slots
    reports = asyncio.run(sync_send(tensors, [address], bucket_mb=1, num_buffers=2, verify=True, timeout_s=30))
    assert reports[-1].num_buckets == 12 and reports[-1].verified


def test_intact_check_catches_a_sender_that_does_not_wait(spawn_receiver, monkeypatch, sync_send):
    # the same check against a sender whose slot wait is removed: the overwrite must be reported
    async def no_wait(self, tasks):
        return None

    monkeypatch.setattr(WeightSender, "_wait_for_slot", no_wait)
    _, address = spawn_receiver("--hold-s", "0.1", "--check-intact")
    tensors = [(f"w{i}", torch.full((200_000,), float(i))) for i in range(8)]
    with pytest.raises(SyncError, match="changed before the ack|checksum mismatch"):
        asyncio.run(sync_send(tensors, [address], bucket_mb=1, num_buffers=2, verify=True, timeout_s=30))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dead_receiver_times_out_naming_the_peer(spawn_receiver, our_segments, sync_send, transport):
    proc, address = spawn_receiver()
    asyncio.run(sync_send([("w", torch.ones(10))], [address], timeout_s=30, transport=transport))  # alive and serving
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    start = time.monotonic()
    with pytest.raises(SyncTimeout, match=r"receiver 0 did not answer .* within 1\.5 s"):
        asyncio.run(sync_send([("w", torch.ones(10))], [address], timeout_s=1.5, transport=transport))
    assert time.monotonic() - start < 10, "the deadline was not kept"
    assert our_segments() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_receiver_dying_mid_sync_fails_within_the_deadline(spawn_receiver, our_segments, sync_send, transport):
    proc, address = spawn_receiver("--hold-s", "0.5")
    tensors = [(f"w{i}", torch.ones(200_000)) for i in range(6)]

    async def kill_soon():
        await asyncio.sleep(0.7)
        os.kill(proc.pid, signal.SIGKILL)

    async def run():
        killer = asyncio.create_task(kill_soon())
        try:
            await sync_send(tensors, [address], bucket_mb=1, timeout_s=2, transport=transport)
        finally:
            await killer

    start = time.monotonic()
    with pytest.raises(SyncTimeout, match="receiver 0"):
        asyncio.run(run())
    assert time.monotonic() - start < 15
    assert our_segments() == [], "a failed sync must free its buffer"
