"""asyncio client for one or many rollout servers.

Socket invariants: one DEALER per server, connected (the server binds); replies are matched
to requests by id, so any number of requests can be in flight on one socket. Every request
carries a deadline and every wait is bounded by it: a dead, hung or unreachable server
becomes ``RolloutServerError`` naming its address, never a hang. Generate requests go to the
live server with the fewest requests in flight. A server the launcher restarts is marked down
(``mark_down``): its requests in flight fail at once and generate re-issues them to a live server
(waiting for one, within the request's deadline), broadcasts leave it out, and nothing is routed to
it until ``mark_up`` (once it holds the trainer's weights again). A server that stops answers its
requests in flight with ``protocol.SERVER_STOPPING``: the request fails with that error, or, where
the holder restarts servers (``awaits_restarts``), waits for its server to be marked down and is
re-issued. ``channel(i)`` hands the weight sender server ``i``'s socket as an
``rlx.sync.channel.RpcSyncChannel``, which carries each sync request as its own bytes in one
``UpdateWeights`` (``UpdateWeightsEnvelope``); this client never sees them. The socket plumbing
(request-id frames, deadlines) is ``rlx.rpc.RpcClient``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import zmq.asyncio

from rlx.rollout import protocol as p
from rlx.rpc import RpcClient, RpcError
from rlx.sync.channel import RpcSyncChannel
from rlx.sync.errors import SyncError
from rlx.sync.messages import BucketAck


class RolloutServerError(RuntimeError):
    """A rollout server failed a request, answered with an error, or did not answer in time."""


class RolloutClient:
    def __init__(
        self, addresses: Sequence[str], token: str = "", timeout_s: float = 300.0, awaits_restarts: bool = False
    ) -> None:
        if not addresses:
            raise ValueError("no rollout server addresses; set rollout.servers or let rlx train launch servers")
        self.token = token
        self.timeout_s = timeout_s
        self.awaits_restarts = awaits_restarts
        """Whoever holds this client restarts a server that exits and marks it down meanwhile (the launcher with
        rollout.restart_on_failure): a request its stopping server cancelled waits for that, to be re-issued."""
        self._ctx = zmq.asyncio.Context()
        self._peers = [RpcClient(a, f"rollout server {a}", p.decode_reply, self._ctx, hwm=0) for a in addresses]
        self._ids = itertools.count(1)
        self._down: set[int] = set()  # servers being restarted: nothing is routed to them
        self._epochs = [0] * len(addresses)  # times each server was marked down

    def live_indices(self) -> list[int]:
        return [i for i in range(len(self._peers)) if i not in self._down]

    def mark_down(self, index: int) -> None:
        """Server ``index`` died: fail its requests in flight (generate re-issues them), route nothing to it."""
        self._down.add(index)
        self._epochs[index] += 1
        self._peers[index].close()  # pending calls fail now; the next call opens a fresh socket

    def mark_up(self, index: int) -> None:
        self._down.discard(index)

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

    async def _least_loaded(self, deadline: float) -> int:
        """The live server with the fewest requests in flight; waits for one while all are down."""
        while not self.live_indices():
            if time.time() > deadline:
                raise RolloutServerError(
                    f"no rollout server came back up before the request's deadline; "
                    f"{self.addresses} are all restarting (see their logs)"
                )
            await asyncio.sleep(0.1)
        return min(self.live_indices(), key=lambda i: self._peers[i].in_flight)

    async def generate(
        self,
        prompts: Sequence[str | list[int]],
        sampling: p.SamplingSpec,
        timeout_s: float | None = None,
        together: int = 0,
    ) -> list[p.PromptResult]:
        """One request per prompt, each routed to the least-loaded live server; results in prompt order.
        A request whose server dies under it is re-issued to a live one, within the same deadline.
        ``together``: prompts the caller sends at once, these included, over every call it makes at once (each
        server is told its share, ``Generate.together``); 0 = these alone."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        share = -(-max(together, len(prompts)) // max(1, len(self.live_indices())))

        async def one(prompt):
            body = p.Generate(prompt_token_ids=[prompt]) if isinstance(prompt, list) else p.Generate(prompts=[prompt])
            body.sampling = sampling
            body.together = share
            deadline = time.time() + timeout
            while True:
                index = await self._least_loaded(deadline)
                epoch = self._epochs[index]
                try:
                    return (await self.call(index, body, max(deadline - time.time(), 0.1))).results[0]
                except RolloutServerError as exc:
                    if self.awaits_restarts and p.SERVER_STOPPING in str(exc):
                        await self._marked_down(index, epoch, max(deadline - time.time(), 0.0))
                    if self._epochs[index] == epoch or time.time() > deadline:
                        raise  # the server is alive, or stopped for good: its error is the answer

        return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))

    async def _marked_down(self, index: int, epoch: int, within_s: float) -> None:
        """Wait up to ``within_s`` for server ``index`` to be marked down after ``epoch``."""
        until = time.monotonic() + within_s
        while self._epochs[index] == epoch and time.monotonic() < until:
            await asyncio.sleep(0.05)

    async def broadcast(self, body, timeout_s: float | None = None) -> list:
        """``body`` to every live server; one that dies meanwhile is left out of the replies."""
        live = self.live_indices()
        epochs = [self._epochs[i] for i in live]
        replies = await asyncio.gather(*(self.call(i, body, timeout_s) for i in live), return_exceptions=True)
        for i, epoch, reply in zip(live, epochs, replies, strict=True):
            if isinstance(reply, BaseException) and self._epochs[i] == epoch:
                raise reply
        return [reply for reply in replies if not isinstance(reply, BaseException)]

    async def health(self, timeout_s: float = 5.0) -> list[p.HealthResult]:
        return await self.broadcast(p.Health(), timeout_s)

    async def wait_ready(self, timeout_s: float, is_alive=lambda: True) -> list[p.HealthResult]:
        """Poll health until every server answers (their answers, in the order of the addresses); ``is_alive`` lets a
        launcher fail fast."""
        deadline = time.time() + timeout_s
        while True:
            try:
                return await self.health(timeout_s=2.0)
            except RolloutServerError:
                if not is_alive():
                    raise RolloutServerError("a rollout server exited during start-up (see its log above)") from None
                if time.time() > deadline:
                    raise RolloutServerError(
                        f"rollout servers {self.addresses} not ready after {timeout_s:.0f}s; "
                        "raise rollout.startup_timeout_s or check the server log"
                    ) from None

    async def pause(self) -> None:
        await self.broadcast(p.Pause())

    async def resume(self) -> None:
        await self.broadcast(p.Resume())

    async def stats(self) -> list[p.StatsResult]:
        return await self.broadcast(p.Stats())

    async def shutdown(self) -> None:
        await self.broadcast(p.Shutdown(), timeout_s=10.0)

    def channel(self, index: int) -> RpcSyncChannel:
        """Server ``index`` as a weight-sync ``SyncChannel``, over the same socket as its other requests."""
        return RpcSyncChannel(self._peers[index], UpdateWeightsEnvelope(self.token))

    def channels(self) -> list[RpcSyncChannel]:
        return [self.channel(i) for i in range(len(self._peers))]

    def close(self) -> None:
        for peer in self._peers:
            peer.close()
        self._ctx.term()


class UpdateWeightsEnvelope:
    """A sync request's bytes as a rollout server takes them: one ``UpdateWeights`` in a ``Request`` with the
    call's deadline and the auth token; the ``AckResult`` of its reply is the ``BucketAck``."""

    _ids = itertools.count(1)  # the envelope's request ids (the server logs them)

    def __init__(self, token: str) -> None:
        self.token = token

    def wrap(self, payload: bytes, timeout_s: float) -> bytes:
        return p.encode(
            p.Request(
                id=next(self._ids),
                body=p.UpdateWeights(payload=payload),
                deadline=time.time() + timeout_s,
                token=self.token,
            )
        )

    def unwrap(self, reply: p.Reply, peer: str, label: str) -> BucketAck:
        if not reply.ok:
            raise SyncError(f"{peer} failed {label}: {reply.error}")
        return reply.body.ack
