"""The control channel a ``WeightSender`` talks through: one request in, one ``BucketAck`` out.

The sender only needs ``call``; how requests travel is the implementation's business
(``RpcSyncChannel``: to a receiver process as they are, to a rollout server as each request's
bytes inside the envelope the rollout client hands it). Several calls
may be in flight on one channel at once (one per buffer slot), so an implementation must match
replies to requests. For the sender's copies to overlap the receivers' loads, ``call`` should put
its request on the wire before it first suspends (a zmq.asyncio send does); the sender yields
once after starting a bucket's calls, then copies the next bucket.
"""

from __future__ import annotations

from typing import Any, Protocol

import zmq.asyncio

from rlx.rpc import RpcClient, RpcError, RpcTimeout
from rlx.sync.errors import SyncError, SyncTimeout
from rlx.sync.messages import BucketAck, SyncBegin, SyncBucket, SyncEnd, SyncPing, decode_ack, encode, request_label

__all__ = ["Envelope", "RpcSyncChannel", "SyncChannel", "SyncTimeout"]


class SyncChannel(Protocol):
    name: str
    """The peer, as error messages should name it (e.g. "rollout server 0 (tcp://10.0.0.2:5557)")."""

    async def call(self, request: SyncBegin | SyncBucket | SyncEnd | SyncPing, timeout_s: float) -> BucketAck:
        """Send one request and return its reply; raise ``SyncTimeout`` naming the peer when no
        reply arrives within ``timeout_s``."""
        ...


class Envelope(Protocol):
    """How a peer that serves more than weight syncs (a rollout server) carries one: ``wrap`` puts a sync
    request's bytes into the peer's own request, ``unwrap`` takes the ``BucketAck`` out of its decoded reply
    (raising ``SyncError`` naming the peer and ``label`` on an error reply)."""

    def wrap(self, payload: bytes, timeout_s: float) -> bytes: ...

    def unwrap(self, reply: Any, peer: str, label: str) -> BucketAck: ...


class RpcSyncChannel:
    """A ``SyncChannel`` (``rlx.sync.channel``): one sync request per ``RpcClient`` call, its ``BucketAck`` back.

    Two peers answer it. A receiver process (``receiver_process``) takes the request's bytes as they
    are and answers with the ack's bytes: ``RpcSyncChannel.connect(address)`` opens a socket of its
    own. A rollout server takes them in its protocol's envelope (``UpdateWeights`` in a ``Request`` with
    the call's deadline and the auth token) and answers in it: ``RpcSyncChannel(rpc, envelope)``, made by
    the rollout client, shares its socket to that server (which the rollout client owns and closes), so
    weights and generate requests travel together and this layer never imports the rollout protocol.
    A silent peer raises ``SyncTimeout``, a failed call ``SyncError``, both naming the peer and the
    request. Several calls may be in flight at once (one per buffer slot).
    """

    def __init__(self, rpc: RpcClient, envelope: Envelope | None = None):
        self._rpc, self._envelope = rpc, envelope
        self.name = rpc.name
        self.address = rpc.address  # where a gloo / nccl sender's group must reach

    @classmethod
    def connect(
        cls, address: str, name: str | None = None, context: zmq.asyncio.Context | None = None
    ) -> RpcSyncChannel:
        """A channel to the receiver process bound at ``address``, on a socket of its own."""
        return cls(RpcClient(address, name or f"receiver at {address}", decode_ack, context))

    async def call(self, request, timeout_s: float) -> BucketAck:
        label = request_label(request)
        payload = encode(request)
        if self._envelope is not None:
            payload = self._envelope.wrap(payload, timeout_s)
        try:
            reply = await self._rpc.call(payload, timeout_s, label)
        except RpcTimeout as exc:
            raise SyncTimeout(str(exc)) from None
        except RpcError as exc:
            raise SyncError(str(exc)) from None
        return reply if self._envelope is None else self._envelope.unwrap(reply, self.name, label)

    def close(self) -> None:
        """Close the socket this channel opened (``connect``); a rollout server's belongs to the rollout client."""
        if self._envelope is None:
            self._rpc.close()
