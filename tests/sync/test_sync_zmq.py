"""The receiver process on its real ROUTER socket: malformed frames get error replies, it keeps serving."""

import asyncio

import zmq

from rlx.sync.channel import RpcSyncChannel
from rlx.sync.messages import NO_ID, SyncPing, decode_ack, encode


def exchange(address, frames, timeout_ms=10_000):
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address)
        socket.send_multipart(frames)
        assert socket.poll(timeout_ms), "the receiver did not reply"
        return socket.recv_multipart()
    finally:
        socket.close()
        context.term()


def test_malformed_messages_get_error_replies_and_the_receiver_keeps_serving(receiver_address):
    request_id = (7).to_bytes(8, "little")
    for payload in (b"\x00garbage", b"", encode(SyncPing())[:-3], b"\x81\xa4type\xa5bogus"):
        reply_id, body = exchange(receiver_address, [request_id, payload])
        ack = decode_ack(body)
        assert reply_id == request_id
        assert not ack.ok and "malformed" in ack.error and (ack.sync_id, ack.bucket_id) == (NO_ID, NO_ID)
    reply_id, body = exchange(receiver_address, [request_id, encode(SyncPing(version=99))])
    assert "version 99" in decode_ack(body).error
    reply_id, body = exchange(receiver_address, [b"only-one-frame"])
    assert reply_id == b"" and "expected [request_id, payload]" in decode_ack(body).error
    reply_id, body = exchange(receiver_address, [request_id, encode(SyncPing())])
    assert decode_ack(body).ok


def test_channel_matches_concurrent_replies_to_their_requests(receiver_address):
    async def many_pings():
        channel = RpcSyncChannel.connect(receiver_address, name="test receiver")
        try:
            return await asyncio.gather(*(channel.call(SyncPing(), 10) for _ in range(20)))
        finally:
            channel.close()

    acks = asyncio.run(many_pings())
    assert len(acks) == 20 and all(ack.ok for ack in acks)
