"""The control channel a ``WeightSender`` talks through: one request in, one ``BucketAck`` out.

The sender only needs ``call``; how requests travel is the implementation's business
(``rpc.RpcSyncChannel``: to a receiver process as they are, to a rollout server as each request's
bytes in one ``UpdateWeights``). Several calls
may be in flight on one channel at once (one per buffer slot), so an implementation must match
replies to requests. For the sender's copies to overlap the receivers' loads, ``call`` should put
its request on the wire before it first suspends (a zmq.asyncio send does); the sender yields
once after starting a bucket's calls, then copies the next bucket.
"""

from __future__ import annotations

from typing import Protocol

from rlx.sync.errors import SyncTimeout
from rlx.sync.messages import BucketAck, SyncBegin, SyncBucket, SyncEnd, SyncPing

__all__ = ["SyncChannel", "SyncTimeout"]


class SyncChannel(Protocol):
    name: str
    """The peer, as error messages should name it (e.g. "rollout server 0 (tcp://10.0.0.2:5557)")."""

    async def call(self, request: SyncBegin | SyncBucket | SyncEnd | SyncPing, timeout_s: float) -> BucketAck:
        """Send one request and return its reply; raise ``SyncTimeout`` naming the peer when no
        reply arrives within ``timeout_s``."""
        ...
