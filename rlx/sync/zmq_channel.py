"""A ``SyncChannel`` over ZeroMQ: one DEALER socket to one receiver's ROUTER.

Frames: ``[request_id (8 bytes, little endian), msgpack request]`` out and ``[request_id,
msgpack BucketAck]`` back, so several requests may be in flight (one per buffer slot) and a late
reply to a request that already timed out is recognised and dropped. The receiver side of this
framing is ``receiver_process.serve``; ``frames_reply`` is its reusable core.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import zmq
import zmq.asyncio

from rlx.sync.errors import SyncError, SyncTimeout
from rlx.sync.messages import BucketAck, decode_ack, encode, request_label

log = logging.getLogger(__name__)


class ZmqSyncChannel:
    """Client end of a weight-sync control channel to the receiver bound at ``address``.

    Socket invariants (DEALER, created lazily inside the running event loop):

    * it connects; the receiver binds (ROUTER), so a receiver restarts at the same address and
      the channel reconnects on its own;
    * ``IMMEDIATE=1``: requests are queued only to a connected peer, so nothing piles up for a peer
      that is gone; a send that cannot go out waits, bounded by the call's deadline;
    * ``SNDHWM=RCVHWM=1000`` messages: far above the handful a sync keeps in flight;
    * ``LINGER=0``: ``close`` never blocks on undelivered requests;
    * a dead or silent peer: the call raises ``SyncTimeout`` naming the peer when its deadline
      passes; nothing waits without a deadline.
    """

    def __init__(self, address: str, name: str | None = None, context: zmq.asyncio.Context | None = None):
        self.address = address
        self.name = name or f"receiver at {address}"
        self._context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)

    async def call(self, request, timeout_s: float) -> BucketAck:
        socket = self._ensure_socket()
        request_id = next(self._ids)
        reply = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            # one deadline for the send and the reply; a send that went out at once is not awaited
            async with asyncio.timeout(timeout_s):
                sent = socket.send_multipart([request_id.to_bytes(8, "little"), encode(request)])
                if not sent.done():
                    await sent
                sent.result()
                return await reply
        except TimeoutError:
            raise SyncTimeout(f"no reply from {self.name} within {timeout_s:g} s to {request_label(request)}; "
                              "is the receiver alive and serving this address?") from None
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SyncError(f"channel to {self.name} closed"))
        self._pending.clear()

    def _ensure_socket(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            context = self._context or zmq.asyncio.Context.instance()
            socket = context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IMMEDIATE, 1)
            socket.setsockopt(zmq.SNDHWM, 1000)
            socket.setsockopt(zmq.RCVHWM, 1000)
            socket.connect(self.address)
            self._socket = socket
            self._reader = asyncio.get_running_loop().create_task(self._read_replies(socket))
        return self._socket

    async def _read_replies(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 2 or len(frames[0]) != 8:
                log.warning("dropping a malformed reply from %s (%d frames)", self.name, len(frames))
                continue
            future = self._pending.get(int.from_bytes(frames[0], "little"))
            if future is None or future.done():
                continue  # reply to a request that already timed out
            try:
                future.set_result(decode_ack(frames[1]))
            except Exception as exc:  # noqa: BLE001 - a bad reply fails its call, not the reader
                future.set_exception(SyncError(f"undecodable reply from {self.name}: {exc}"))
