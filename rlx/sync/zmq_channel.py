"""A ``SyncChannel`` over ZeroMQ to a receiver process's ROUTER (``receiver_process.serve``).

The request/reply plumbing (id frames, deadline, the peer's name in every error) is
``rlx.sync.rpc.RpcClient``'s; this module only encodes sync requests, decodes ``BucketAck``
replies and turns the helper's errors into ``SyncTimeout`` / ``SyncError``.
"""

from __future__ import annotations

import zmq.asyncio

from rlx.sync.errors import SyncError, SyncTimeout
from rlx.sync.messages import BucketAck, decode_ack, encode, request_label
from rlx.sync.rpc import RpcClient, RpcError, RpcTimeout


class ZmqSyncChannel:
    """Client end of a weight-sync control channel to the receiver bound at ``address``; several
    requests may be in flight at once (one per buffer slot)."""

    def __init__(self, address: str, name: str | None = None, context: zmq.asyncio.Context | None = None):
        self.address = address
        self.name = name or f"receiver at {address}"
        self._rpc = RpcClient(address, self.name, decode_ack, context)

    async def call(self, request, timeout_s: float) -> BucketAck:
        try:
            return await self._rpc.call(encode(request), timeout_s, request_label(request))
        except RpcTimeout:
            raise SyncTimeout(f"no reply from {self.name} within {timeout_s:g} s to {request_label(request)}; "
                              "is the receiver alive and serving this address?") from None
        except RpcError as exc:
            raise SyncError(str(exc)) from None

    def close(self) -> None:
        self._rpc.close()
