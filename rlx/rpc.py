"""The one ZeroMQ request/reply helper, and the factory of every request/reply socket rlx opens.

``router`` (the serving end: it binds) and ``dealer`` (the calling end: it connects) make the sockets of
the rollout server, the sync receiver, the sample store's TCP transport and ``RpcClient`` with the same
options: ``LINGER=0`` (closing or exiting never blocks on undelivered messages), high-water marks given in
messages each way (0 = unbounded, where the caller bounds what is in flight), and optionally a largest
accepted message (``MAXMSGSIZE``: a peer's oversized frame drops its connection instead of allocating it).

``RpcClient`` (asyncio) and ``call_blocking`` (for a caller outside an event loop) are the calling end: a
DEALER that matches replies to requests by an id frame. The rollout client (``rlx.rollout.client``) and the
weight sync's channel (``rlx.sync.channel.RpcSyncChannel``) use ``RpcClient``, the sample store's TCP
reader ``call_blocking``. Frames out: ``[request_id (8 bytes, little endian), payload]``; a ROUTER peer
answers ``[request_id, reply]`` by echoing the frames before the payload (``reply_frames``), so any number of
requests may be in flight on one socket and a late reply to a request that already timed out is recognised
and dropped. Payloads are msgspec-encoded by the caller; ``RpcClient`` decodes replies with the caller's
decoder. Every call has a deadline, and every error names the peer and the request.

Left out: what the payloads mean, retries, and the server side's loop (each server has its own).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

R = TypeVar("R")


def router(
    context: zmq.Context, address: str | None, hwm: int = 1000, max_message_bytes: int | None = None
) -> zmq.Socket:
    """A ROUTER for the serving end, bound to ``address`` (``None``: the caller binds it, e.g. to a random
    port); each request's reply goes back to the identity it came from."""
    socket = _configured(context.socket(zmq.ROUTER), hwm, max_message_bytes)
    if address is not None:
        try:
            socket.bind(address)
        except zmq.ZMQError:
            socket.close(linger=0)
            raise
    return socket


def dealer(context: zmq.Context, address: str, hwm: int = 1000, immediate: bool = False) -> zmq.Socket:
    """A DEALER for the calling end, connected to ``address`` (a peer restarting there is reached again);
    ``immediate``: queue messages only to a connected peer, so nothing piles up for one that is gone."""
    socket = _configured(context.socket(zmq.DEALER), hwm, None)
    if immediate:
        socket.setsockopt(zmq.IMMEDIATE, 1)
    socket.connect(address)
    return socket


def _configured(socket: zmq.Socket, hwm: int, max_message_bytes: int | None) -> zmq.Socket:
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    if max_message_bytes is not None:
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    return socket


class RpcError(RuntimeError):
    """A reply that could not be decoded, or a channel closed under a call; names the peer."""


class RpcTimeout(RpcError, TimeoutError):
    """No reply within the call's deadline; names the peer, the request and the deadline."""


class RpcClient(Generic[R]):
    """Client end of a request/reply channel to the ROUTER bound at ``address``.

    Socket invariants (DEALER, created lazily inside the running event loop):

    * it connects; the peer binds (ROUTER), so a peer restarting at the same address is reached
      again without a new client;
    * ``IMMEDIATE=1``: requests are queued only to a connected peer, so nothing piles up for a peer
      that is gone; a send that cannot go out waits, bounded by the call's deadline;
    * high-water marks ``hwm`` messages each way (0 = unbounded: back-pressure is the caller's
      number of requests in flight);
    * ``LINGER=0``: ``close`` never blocks on undelivered requests;
    * a dead or silent peer: the call raises ``RpcTimeout`` naming the peer when its deadline passes.
    """

    def __init__(
        self,
        address: str,
        name: str,
        decode: Callable[[bytes], R],
        context: zmq.asyncio.Context | None = None,
        hwm: int = 1000,
    ):
        self.address, self.name = address, name
        self._decode, self._context, self._hwm = decode, context, hwm
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def call(self, payload: bytes, timeout_s: float, label: str = "a request") -> R:
        """Send ``payload`` and return its decoded reply; ``RpcTimeout`` when none comes within
        ``timeout_s`` (one deadline for the send and the reply)."""
        socket = self._ensure_socket()
        request_id = next(self._ids)
        reply = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            async with asyncio.timeout(timeout_s):
                sent = socket.send_multipart([request_id.to_bytes(8, "little"), payload])
                if not sent.done():  # a send that went out at once is not awaited
                    await sent
                sent.result()
                return await reply
        except TimeoutError:
            raise RpcTimeout(
                f"{self.name} did not answer {label} within {timeout_s:g} s: it is dead, hung or "
                "unreachable (check its log)"
            ) from None
        except asyncio.CancelledError:
            if reply.done() and not reply.cancelled():  # close() under a waiting send cancels the send
                raise reply.exception() from None
            raise
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
                future.set_exception(RpcError(f"channel to {self.name} closed"))
        self._pending.clear()

    def _ensure_socket(self) -> zmq.asyncio.Socket:
        if self._socket is None:
            context = self._context or zmq.asyncio.Context.instance()
            socket = dealer(context, self.address, self._hwm, immediate=True)
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
                continue  # a reply to a request that already timed out
            try:
                future.set_result(self._decode(frames[1]))
            except Exception as exc:  # noqa: BLE001 - a bad reply fails its own call, not the reader
                future.set_exception(RpcError(f"undecodable reply from {self.name}: {exc}"))


def call_blocking(socket: zmq.Socket, request_id: int, payload: bytes, deadline: float) -> list[bytes] | None:
    """``RpcClient.call`` for a caller outside an event loop (a blocking DEALER from ``dealer``): send
    ``[request_id, payload]`` and return the frames after the id of the reply that carries it, dropping
    replies to earlier requests that timed out; ``None`` once ``deadline`` (``time.monotonic``) passes."""
    tag = request_id.to_bytes(8, "little")
    if not socket.poll(_left_ms(deadline), zmq.POLLOUT):
        return None
    socket.send_multipart([tag, payload])
    while True:
        if time.monotonic() >= deadline or not socket.poll(_left_ms(deadline)):
            return None
        frames = socket.recv_multipart()
        if frames[0] == tag:
            return frames[1:]


def _left_ms(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def reply_frames(frames: list[bytes], reply: bytes) -> list[bytes]:
    """A ROUTER's answer to ``frames`` (``[identity, *envelope, payload]``): the same identity and
    envelope (an ``RpcClient``'s request id; nothing from a plain one-frame DEALER), then ``reply``."""
    return [*frames[:-1], reply]
