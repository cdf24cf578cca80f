"""asyncio client for one or many rollout servers.

Socket invariants: one DEALER per server, connected (the server binds); replies are matched
to requests by id, so any number of requests can be in flight on one socket. Every request
carries a deadline and every wait is bounded by it: a dead, hung or unreachable server
becomes ``RolloutServerError`` naming its address, never a hang. Generate requests go to the
server with the fewest requests in flight. ``channel(i)`` adapts server ``i`` to the
``rlx.sync`` sender's ``SyncChannel`` so weights stream over the same socket: each sync request
travels as its own bytes in one ``UpdateWeights``, untouched. The socket plumbing (request-id
frames, deadlines) is ``rlx.sync.rpc.RpcClient``, shared with the sync channel.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Sequence

import zmq.asyncio

from rlx.rollout import protocol as p
from rlx.sync.messages import BucketAck, encode
from rlx.sync.rpc import RpcClient, RpcError


class RolloutServerError(RuntimeError):
    """A rollout server failed a request, answered with an error, or did not answer in time."""


class RolloutClient:
    def __init__(self, addresses: Sequence[str], token: str = "", timeout_s: float = 300.0) -> None:
        if not addresses:
            raise ValueError("no rollout server addresses; set rollout.servers or let rlx train launch servers")
        self.token = token
        self.timeout_s = timeout_s
        self._ctx = zmq.asyncio.Context()
        self._peers = [RpcClient(a, f"rollout server {a}", p.decode_reply, self._ctx, hwm=0) for a in addresses]
        self._ids = itertools.count(1)

    @property
    def addresses(self) -> list[str]:
        return [peer.address for peer in self._peers]

    async def call(self, index: int, body, timeout_s: float | None = None):
        """Send ``body`` to server ``index`` and return the reply body; raise naming the server."""
        peer = self._peers[index]
        timeout = self.timeout_s if timeout_s is None else timeout_s
        request = p.Request(id=next(self._ids), body=body, deadline=time.time() + timeout, token=self.token)
        try:
            reply = await peer.call(p.encode(request), timeout, type(body).__name__)
        except RpcError as exc:
            raise RolloutServerError(str(exc)) from None
        if not reply.ok:
            raise RolloutServerError(f"rollout server {peer.address} failed {type(body).__name__}: {reply.error}")
        return reply.body

    def _least_loaded(self) -> int:
        return min(range(len(self._peers)), key=lambda i: self._peers[i].in_flight)

    async def generate(self, prompts: Sequence[str | list[int]], sampling: p.SamplingSpec,
                       timeout_s: float | None = None) -> list[p.PromptResult]:
        """One request per prompt, each routed to the least-loaded server; results in prompt order."""
        async def one(prompt):
            index = self._least_loaded()
            body = p.Generate(prompt_token_ids=[prompt]) if isinstance(prompt, list) else p.Generate(prompts=[prompt])
            body.sampling = sampling
            result = await self.call(index, body, timeout_s)
            return result.results[0]

        return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))

    async def broadcast(self, body, timeout_s: float | None = None) -> list:
        return list(await asyncio.gather(*(self.call(i, body, timeout_s) for i in range(len(self._peers)))))

    async def health(self, timeout_s: float = 5.0) -> list[p.HealthResult]:
        return await self.broadcast(p.Health(), timeout_s)

    async def wait_ready(self, timeout_s: float, is_alive=lambda: True) -> None:
        """Poll health until every server answers; ``is_alive`` lets a launcher fail fast."""
        deadline = time.time() + timeout_s
        while True:
            try:
                await self.health(timeout_s=2.0)
                return
            except RolloutServerError:
                if not is_alive():
                    raise RolloutServerError("a rollout server exited during start-up (see its log above)") from None
                if time.time() > deadline:
                    raise RolloutServerError(
                        f"rollout servers {self.addresses} not ready after {timeout_s:.0f}s; "
                        "raise rollout.startup_timeout_s or check the server log") from None

    async def pause(self) -> None:
        await self.broadcast(p.Pause())

    async def resume(self) -> None:
        await self.broadcast(p.Resume())

    async def stats(self) -> list[p.StatsResult]:
        return await self.broadcast(p.Stats())

    async def shutdown(self) -> None:
        await self.broadcast(p.Shutdown(), timeout_s=10.0)

    def channel(self, index: int) -> "ServerChannel":
        return ServerChannel(self, index)

    def channels(self) -> list["ServerChannel"]:
        return [self.channel(i) for i in range(len(self._peers))]

    def close(self) -> None:
        for peer in self._peers:
            peer.close()
        self._ctx.term()


class ServerChannel:
    """A rollout server seen as a weight-sync ``SyncChannel``."""

    def __init__(self, client: RolloutClient, index: int) -> None:
        self.client = client
        self.index = index
        self.address = client.addresses[index]  # where a gloo / nccl sender's group must reach
        self.name = f"rollout server {self.address}"

    async def call(self, request, timeout_s: float) -> BucketAck:
        """Any sync request, carried as its own bytes in one ``UpdateWeights``; the server's handler
        answers it."""
        body = p.UpdateWeights(payload=encode(request))
        return (await self.client.call(self.index, body, timeout_s)).ack
