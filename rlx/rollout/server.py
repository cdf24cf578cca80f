"""The rollout server: one ZeroMQ ROUTER socket in front of one backend (vLLM or transformers).

Socket invariants: the server binds (``ipc://`` or loopback TCP unless remote binding was asked
for explicitly, which then requires a token); clients connect DEALER sockets; each request is
handled in its own task, so many generate requests run concurrently and the engine batches
them. Weight-update messages are applied strictly one at a time, in arrival order. A
malformed, expired, wrong-version or unauthenticated message gets an error reply and a log
line; the server keeps serving. High-water marks are 0 (unbounded): back-pressure is the
client's number of requests in flight, not dropped messages.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import signal
import time
from urllib.parse import urlparse

import msgspec
import zmq
import zmq.asyncio

from rlx.rollout import protocol as p
from rlx.rollout.backends.base import Backend
from rlx.sync.messages import BucketAck
from rlx.trace import tracer

log = logging.getLogger("rlx.rollout.server")


def is_loopback_address(address: str) -> bool:
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = urlparse(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_address(address: str, allow_remote: bool, token: str) -> None:
    if not address.startswith(("tcp://", "ipc://")):
        raise ValueError(f"address {address!r} must start with tcp:// or ipc://")
    if is_loopback_address(address):
        return
    if not allow_remote:
        raise ValueError(f"refusing to bind {address}: it is not loopback; pass --allow-remote and set "
                         "rollout.auth_token to bind another interface")
    if not token:
        raise ValueError(f"binding {address} needs an auth token; set rollout.auth_token to a shared secret")


class RolloutServer:
    def __init__(self, backend: Backend, address: str, token: str = "") -> None:
        self.backend = backend
        self.address = address
        self.token = token
        self.paused = False
        self.weight_version = 0
        self.in_flight = 0
        self.completed = 0
        self.generated_tokens = 0
        self.started = time.time()
        self._update_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    async def serve(self) -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(self.address)
        self._sock = sock
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        log.info("rollout server (%s) listening on %s", self.backend.name, self.address)
        try:
            while not self._stop.is_set():
                receive = asyncio.ensure_future(sock.recv_multipart())
                stop = asyncio.ensure_future(self._stop.wait())
                done, _ = await asyncio.wait({receive, stop}, return_when=asyncio.FIRST_COMPLETED)
                if receive not in done:
                    receive.cancel()
                    break
                stop.cancel()
                frames = receive.result()
                task = asyncio.create_task(self._handle(frames))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.backend.close()
            sock.close(0)
            ctx.term()

    async def _handle(self, frames: list[bytes]) -> None:
        identity, payload = frames[0], frames[-1]
        try:
            request = p.decode_request(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("malformed message from a client (%d bytes): %s", len(payload), exc)
            await self._send(identity, p.Reply(id=-1, ok=False, error=f"malformed request: {exc}; "
                                               "send an msgpack-encoded rlx.rollout.protocol.Request"))
            return
        reply = await self._reply_to(request)
        await self._send(identity, reply)

    async def _reply_to(self, request: p.Request) -> p.Reply:
        problem = self._reject_reason(request)
        if problem:
            # An expired deadline is routine (a client gave up, e.g. start-up health polls).
            level = logging.DEBUG if problem.startswith("deadline") else logging.WARNING
            log.log(level, "rejected request %d: %s", request.id, problem)
            return p.Reply(id=request.id, ok=False, error=problem)
        try:
            body = await self._dispatch(request.body, request.id)
        except Exception as exc:  # the request fails, the server stays up
            log.exception("request %d (%s) failed", request.id, type(request.body).__name__)
            return p.Reply(id=request.id, ok=False, error=f"{type(exc).__name__}: {exc}")
        return p.Reply(id=request.id, ok=True, body=body)

    def _reject_reason(self, request: p.Request) -> str:
        if request.version != p.PROTOCOL_VERSION:
            return f"protocol version {request.version} is not {p.PROTOCOL_VERSION}; use a matching rlx on both sides"
        if self.token and not hmac.compare_digest(request.token.encode(), self.token.encode()):
            return "bad or missing auth token; set rollout.auth_token to the server's token"
        if request.deadline and request.deadline < time.time():
            return "deadline already passed when the request arrived"
        return ""

    async def _dispatch(self, body, request_id: int = 0):
        if isinstance(body, p.Generate):
            return await self._generate(body, request_id)
        if isinstance(body, p.Health):
            return p.HealthResult(backend=self.backend.name, model=self.backend.model_path, paused=self.paused,
                                  weight_version=self.weight_version)
        if isinstance(body, p.Stats):
            return p.StatsResult(in_flight=self.in_flight, completed=self.completed,
                                 generated_tokens=self.generated_tokens, paused=self.paused,
                                 weight_version=self.weight_version, uptime_s=time.time() - self.started)
        if isinstance(body, p.Pause):
            await self.backend.pause()
            self.paused = True
            return p.Ok()
        if isinstance(body, p.Resume):
            await self.backend.resume()
            self.paused = False
            return p.Ok()
        if isinstance(body, p.Shutdown):
            self._stop.set()
            return p.Ok()
        return p.AckResult(ack=await self._update(body))

    async def _generate(self, body: p.Generate, request_id: int) -> p.GenerateResult:
        prompts = list(body.prompt_token_ids) or list(body.prompts)
        if not prompts:
            raise ValueError("generate request has no prompts; set prompts or prompt_token_ids")
        self.in_flight += len(prompts)
        ids = [f"{request_id}.{i}" for i in range(len(prompts))]
        for rid in ids:
            tracer.event("queued", request_id=rid, paused=self.paused)
        try:
            results = await asyncio.gather(*(self._generate_one(prompt, body.sampling, rid)
                                             for prompt, rid in zip(prompts, ids)))
        finally:
            self.in_flight -= len(prompts)
        self.completed += len(prompts)
        return p.GenerateResult(results=list(results))

    async def _generate_one(self, prompt, sampling: p.SamplingSpec, request_id: str) -> p.PromptResult:
        with tracer.span("generate", request_id=request_id, n=sampling.n) as span:
            result = await self.backend.generate(prompt, sampling)
            tokens = sum(len(s.token_ids) for s in result.samples)
            span.set(prompt_tokens=len(result.prompt_token_ids), completion_tokens=tokens,
                     finish_reason=result.samples[0].finish_reason if result.samples else "")
        self.generated_tokens += tokens
        return result

    async def _update(self, body) -> BucketAck:
        async with self._update_lock:
            if isinstance(body, p.UpdateBegin):
                with tracer.span("sync.begin"):
                    await self.backend.update_begin(body.begin)
                return BucketAck(sync_id=body.begin.sync_id, bucket_id=-1, ok=True)
            if isinstance(body, p.UpdateBucket):
                meta = body.bucket.meta
                with tracer.span("sync.load", bucket_id=meta.bucket_id,
                                 bytes=sum(c.nbytes for c in meta.chunks)):
                    return await self.backend.update_bucket(body.bucket)
            with tracer.span("sync.end"):
                ack = await self.backend.update_end(body.end)
            if ack.ok:
                self.weight_version += 1
            return ack

    async def _send(self, identity: bytes, reply: p.Reply) -> None:
        await self._sock.send_multipart([identity, p.encode(reply)])


async def run_server(backend: Backend, address: str, token: str = "") -> None:
    with tracer.span("rollout.start", backend=backend.name):
        await backend.start()
    await RolloutServer(backend, address, token).serve()
