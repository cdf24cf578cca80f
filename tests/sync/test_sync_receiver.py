"""WeightReceiver and SyncHandler in one process over a real shared-memory buffer."""

import os

import msgspec
import pytest
import torch

from rlx.sync.messages import (
    BucketMeta,
    SyncBegin,
    SyncBucket,
    SyncEnd,
    SyncPing,
    TensorChunk,
    TransportHandle,
    decode_ack,
    decode_request,
    encode,
)
from rlx.sync.receiver import SyncHandler, WeightReceiver
from rlx.sync.receiver_process import CopyConsumer
from rlx.sync.transports.shm import ShmBuffer

SLOT = 4096


@pytest.fixture
def buffer():
    buf = ShmBuffer(SLOT, 2)
    yield buf
    buf.close()


def begin(buffer, sync_id=1, num_tensors=-1, verify=False, **kw):
    return SyncBegin(sync_id, buffer.handle(), num_tensors, -1, verify, **kw)


def chunk(name="w", dtype="float32", shape=(4,), offset=0, nbytes=16, start=0, total=16):
    return TensorChunk(name, dtype, list(shape), offset, nbytes, start, total)


def meta(chunks, sync_id=1, bucket_id=0, slot=0, is_last=False):
    return BucketMeta(sync_id, bucket_id, slot, chunks, is_last)


def test_messages_round_trip_through_msgpack(buffer):
    requests = [begin(buffer, verify=True), SyncBucket(meta([chunk()], is_last=True)), SyncEnd(1), SyncPing()]
    for request in requests:
        assert decode_request(encode(request)) == request
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_request(b"\x93\x01\x02")


def test_views_are_zero_copy_and_split_tensors_are_assembled(buffer):
    receiver = WeightReceiver()
    receiver.begin(begin(buffer, num_tensors=2))
    small = torch.arange(4, dtype=torch.float32)
    big = torch.arange(1536, dtype=torch.float32)  # 6144 bytes: two chunks of a 4096-byte slot
    buffer.slot(0)[:16].copy_(small.view(torch.uint8))
    buffer.slot(0)[256 : 256 + 4096 - 256].copy_(big.view(torch.uint8)[:3840])
    first = meta([chunk(), chunk("big", shape=(1536,), offset=256, nbytes=3840, total=6144)])
    got = receiver.tensors(first)
    assert [n for n, _ in got] == ["w"] and torch.equal(got[0][1], small)
    buffer.slot(0)[:4].fill_(0)  # the sender's side of the mapping: a zero-copy view sees it
    assert got[0][1][0].item() == 0.0 and got[0][1][1].item() == 1.0
    receiver.ack(first)
    buffer.slot(1)[:2304].copy_(big.view(torch.uint8)[3840:])
    second = meta([chunk("big", shape=(1536,), offset=0, nbytes=2304, start=3840, total=6144)], bucket_id=1, slot=1)
    got = receiver.tensors(second)
    assert [n for n, _ in got] == ["big"] and torch.equal(got[0][1], big)
    receiver.ack(second)
    del got
    assert receiver.end(SyncEnd(1)).ok


@pytest.mark.parametrize(
    "bad, match",
    [
        (chunk(offset=SLOT - 8), "aligned range"),
        (chunk(offset=2), "aligned range"),
        (chunk(dtype="object"), "unknown dtype"),
        (chunk(shape=(5,)), "is 20 bytes"),
        (chunk(start=8, nbytes=8, total=16), "before its start"),
    ],
)
def test_bad_chunks_are_refused_before_reading(buffer, bad, match):
    receiver = WeightReceiver()
    receiver.begin(begin(buffer))
    with pytest.raises(ValueError, match=match):
        receiver.tensors(meta([bad]))
    receiver.close()


def test_out_of_order_split_and_incomplete_end_are_errors(buffer):
    receiver = WeightReceiver()
    receiver.begin(begin(buffer))
    receiver.tensors(meta([chunk("big", shape=(1536,), offset=0, nbytes=4096, total=6144)]))
    receiver.ack(meta([], bucket_id=0))
    with pytest.raises(ValueError, match="out of order"):
        receiver.tensors(
            meta([chunk("big", shape=(1536,), offset=0, nbytes=1024, start=5120, total=6144)], bucket_id=1)
        )
    ack = receiver.end(SyncEnd(1))
    assert not ack.ok and "incomplete" in ack.error and "big" in ack.error


def test_wrong_sync_version_and_missing_begin_are_errors(buffer):
    receiver = WeightReceiver()
    with pytest.raises(ValueError, match="before its SyncBegin"):
        receiver.tensors(meta([chunk()]))
    with pytest.raises(ValueError, match="version 99"):
        receiver.begin(begin(buffer, version=99))
    receiver.begin(begin(buffer, sync_id=3))
    with pytest.raises(ValueError, match="during sync 3"):
        receiver.tensors(meta([chunk()], sync_id=2))
    ack = receiver.end(SyncEnd(2))
    assert not ack.ok and "sync in progress is 3" in ack.error


def test_end_refuses_while_the_consumer_still_holds_views(buffer):
    receiver = WeightReceiver(name="r0")
    receiver.begin(begin(buffer))
    held = receiver.tensors(meta([chunk()]))
    receiver.ack(meta([chunk()]))
    ack = receiver.end(SyncEnd(1))
    assert not ack.ok and "still referenced" in ack.error and ack.error.startswith("r0:")
    del held
    receiver.close()  # nothing holds the mapping any more


def test_foreign_shm_names_are_refused():
    receiver = WeightReceiver()
    evil = TransportHandle("shm", SLOT, 2, {"name": "../../etc/passwd", "size": 2 * SLOT})
    with pytest.raises(ValueError, match="not an rlx sync segment"):
        receiver.begin(SyncBegin(1, evil, -1, -1, False))


def test_handler_answers_malformed_bytes_and_keeps_serving(buffer):
    handler = SyncHandler(WeightReceiver(name="h"), CopyConsumer())
    for junk in (
        b"",
        b"\xc1",
        encode(TensorChunk("x", "float32", [1], 0, 4, 0, 4)),
        b'{"json": 1}',
        b"\x91" * 200_000 + b"\xc0",
    ):
        ack = decode_ack(handler.handle_bytes(junk))
        assert not ack.ok and "malformed" in ack.error
    assert decode_ack(handler.handle_bytes(encode(SyncPing()))).ok
    assert decode_ack(handler.handle_bytes(encode(begin(buffer)))).ok
    assert decode_ack(handler.handle_bytes(encode(SyncEnd(1)))).ok


def test_shm_buffer_unlinks_its_segment_on_close(our_segments):
    before = set(our_segments())
    buf = ShmBuffer(SLOT, 2)
    assert set(our_segments()) - before == {buf.path}
    buf.close()
    buf.close()  # idempotent
    assert set(our_segments()) == before


def _killed_sender_segment() -> tuple[str, int]:
    """A real process that made a shm buffer and was SIGKILLed: (its segment's path, its pid)."""
    import signal
    import subprocess
    import sys

    code = (
        "import os, sys, time; from rlx.sync.transports.shm import ShmBuffer; b = ShmBuffer(4096, 2); "
        "print(b.path, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    return path, proc.pid


def test_segments_of_a_killed_sender_can_be_removed_by_pid():
    from rlx.sync.transports.shm import remove_segments_of

    path, pid = _killed_sender_segment()
    assert os.path.exists(path), "SIGKILL leaves the segment behind"
    assert remove_segments_of(pid) == [path] and not os.path.exists(path)


def test_stale_segments_of_dead_senders_are_removed_and_live_ones_kept():
    from rlx.sync.transports.shm import ShmBuffer, remove_stale_segments

    dead, _ = _killed_sender_segment()
    live = ShmBuffer(4096, 2)  # this process's own: alive, must stay
    try:
        removed = remove_stale_segments()
        assert dead in removed and not os.path.exists(dead)
        assert live.path not in removed and os.path.exists(live.path)
    finally:
        live.close()
