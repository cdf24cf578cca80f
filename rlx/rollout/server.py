"""The rollout server: one ZeroMQ ROUTER socket in front of one backend (vLLM or transformers).

Socket invariants: the server binds (``ipc://`` or loopback TCP unless remote binding was asked
for explicitly, which then requires a token); clients connect DEALER sockets; each request is
handled in its own task, so many generate requests run concurrently and the engine batches
them. A weight update is one ``UpdateWeights`` request whose payload goes to the backend's
``update_weights`` untouched, strictly one at a time, in arrival order; the ack comes back as it
is. A ROUTER reply echoes the frames before the payload (an ``rlx.rpc`` request id). A
malformed, expired, wrong-version or unauthenticated message gets an error reply and a log
line; the server keeps serving. High-water marks are 0 (unbounded): back-pressure is the
client's number of requests in flight, not dropped messages.

Bounds: a generate request is checked against ``protocol.generate_problem`` and each prompt
against the context (``rollout.max_model_len``), and refused with the field and its range;
``max_tokens`` is capped to the room a prompt leaves. A request without a deadline gets
``rollout.request_timeout_s``; at its deadline it is cancelled (the backend stops generating
it) and answered with an error. A weight update that fails, or whose sender sends nothing for
``sync.timeout_s``, is aborted, so the backend generates again and takes the next sync. When the
backend reports a failure (its engine died), every request in flight and every new one is
answered with that failure, and the server stops and raises ``BackendDied`` (a non-zero exit). When
the server stops (SIGTERM, SIGINT, ``Shutdown``), every request still in flight is cancelled and
answered that the server is stopping, so no client waits out its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import signal
import time
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from rlx import rpc
from rlx.net import ipc_path, is_loopback_address
from rlx.rollout import protocol as p
from rlx.rollout.backends.base import Backend
from rlx.rpc import reply_frames
from rlx.sync.messages import BucketAck, SyncAbort, encode
from rlx.trace import startup, tracer

log = logging.getLogger("rlx.rollout.server")
UNREAD_GRACE_MS = 100
"""How long a stopping server waits for the requests its socket holds but it has not read (ZeroMQ's I/O thread
may not have handed them over yet) before it answers them that it is stopping."""


def check_bind_address(address: str, allow_remote: bool, token: str) -> None:
    if not address.startswith(("tcp://", "ipc://")):
        raise ValueError(f"address {address!r} must start with tcp:// or ipc://")
    if is_loopback_address(address):
        return
    if not allow_remote:
        raise ValueError(
            f"refusing to bind {address}: it is not loopback; pass --allow-remote and set "
            "rollout.auth_token to bind another interface"
        )
    if not token:
        raise ValueError(f"binding {address} needs an auth token; set rollout.auth_token to a shared secret")


class BackendDied(RuntimeError):
    """The backend can no longer serve (e.g. its engine process died); the server exits on it."""


class RequestRefused(ValueError):
    """A request outside the limits the server enforces; answered with an error, logged without a traceback."""


class RolloutServer:
    def __init__(
        self,
        backend: Backend,
        address: str,
        token: str = "",
        max_model_len: int = 512,
        request_timeout_s: float = 300.0,
        sync_timeout_s: float = 120.0,
    ) -> None:
        self.backend = backend
        self.address = address
        self.token = token
        self.max_model_len = max_model_len
        self.request_timeout_s = request_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.paused = False
        self.weight_version = 0
        self.in_flight = 0
        self.completed = 0
        self.generated_tokens = 0
        self.started = time.time()
        self.death = ""
        self._died = asyncio.Event()
        self._sync_open = False  # the backend's last ack said a weight update is still open
        self._sync_touched = 0.0  # time.monotonic() of its last message
        self._update_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.episodes = None  # the OpenAI endpoint's EpisodeStore (rlx.rollout.openai_http), when it serves one
        self._generates = itertools.count(1)  # the trace's request ids: a client's own ids restart at 1

    async def serve(self, watch_interval_s: float = 0.5, drain_s: float = 1.0) -> None:
        """Serve until Shutdown, SIGTERM/SIGINT or the backend's death (then raise ``BackendDied``)."""
        ctx = zmq.asyncio.Context()
        sock = rpc.router(ctx, self.address, hwm=0)
        self._sock = sock
        ipc_file = _ipc_file(self.address)  # ZeroMQ leaves the file behind: removed below if still ours
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        watch = asyncio.create_task(self._watch(watch_interval_s, drain_s))
        log.info("rollout server (%s) listening on %s", self.backend.name, self.address)
        try:
            await self._receive_loop(sock)
            if self._tasks:  # let requests that were just answered with the backend's death send it
                await asyncio.wait(list(self._tasks), timeout=drain_s)
        finally:
            watch.cancel()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:  # each request still in flight answers that the server is stopping
                await asyncio.wait(list(self._tasks), timeout=drain_s)
            await self._refuse_unread(sock)
            await self._close_backend()
            sock.close(linger=int(drain_s * 1000))  # the stopping replies leave before the socket goes
            ctx.term()
            if ipc_file is not None and _ipc_file(self.address) == ipc_file:
                with contextlib.suppress(OSError):
                    ipc_file[0].unlink()
        if self.death:
            raise BackendDied(self.death)

    async def _receive_loop(self, sock) -> None:
        while not self._stop.is_set():
            receive = asyncio.ensure_future(sock.recv_multipart())
            stop = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait({receive, stop}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:
                receive.cancel()
                break
            stop.cancel()
            task = asyncio.create_task(self._handle(receive.result()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _refuse_unread(self, sock) -> None:
        """Requests that arrived as the server stopped and were never read: each is answered that the server
        is stopping, so its caller can send it to a live server at once instead of waiting out its timeout."""
        while await sock.poll(UNREAD_GRACE_MS, zmq.POLLIN):
            frames = await sock.recv_multipart()
            reply = p.Reply(id=p.request_id(frames[-1]), ok=False, error=p.SERVER_STOPPING)
            await self._send(frames, reply)

    async def _close_backend(self, timeout_s: float = 30.0) -> None:
        try:
            await asyncio.wait_for(self.backend.close(), timeout_s)
        except Exception:  # closing a dead engine may fail; the process exits either way
            log.exception("closing the %s backend failed", self.backend.name)

    async def _watch(self, interval_s: float, drain_s: float) -> None:
        """Every ``interval_s``: stop on the backend's death; abort a sync whose sender went silent."""
        while True:
            await asyncio.sleep(interval_s)
            reason = self.backend.failure()
            if reason:
                log.error("%s; failing every request and exiting", reason)
                self.death = reason
                self._died.set()
                asyncio.get_running_loop().call_later(drain_s, self._stop.set)
                return
            if self._sync_open and time.monotonic() - self._sync_touched > self.sync_timeout_s:
                await self._expire_sync()

    async def _expire_sync(self) -> None:
        """Abort an open weight update whose sender went silent, through the one update path."""
        async with self._update_lock:
            if not self._sync_open or time.monotonic() - self._sync_touched <= self.sync_timeout_s:
                return
            reason = f"its sender sent nothing for {self.sync_timeout_s:g} s (sync.timeout_s)"
            log.warning(
                "weight update aborted: %s; the weights may mix old and new until the next sync, generation goes on",
                reason,
            )
            try:
                with tracer.span("sync.abort"):
                    self._sync_open = (await self.backend.update_weights(encode(SyncAbort(reason)))).in_sync
            except Exception:  # the watchdog must go on watching the backend
                log.exception("aborting the weight update in the %s backend failed", self.backend.name)
                self._sync_open = False

    async def _handle(self, frames: list[bytes]) -> None:
        payload = frames[-1]
        try:
            request = p.decode_request(payload)
        except p.MalformedRequest as exc:
            log.warning("malformed message from a client (%d bytes): %s", len(payload), exc)
            await self._send(frames, p.Reply(id=exc.request_id, ok=False, error=str(exc)))
            return
        try:
            reply = await self.answer(request)
        except asyncio.CancelledError:
            if not self._stop.is_set():
                raise
            reply = p.Reply(id=request.id, ok=False, error=p.SERVER_STOPPING)
        await self._send(frames, reply)

    async def answer(self, request: p.Request) -> p.Reply:
        """The reply to one request: the one path every request takes, from ZeroMQ or the OpenAI endpoint."""
        problem = self._reject_reason(request)
        if problem:
            # An expired deadline is routine (a client gave up, e.g. start-up health polls).
            level = logging.DEBUG if problem.startswith("deadline") else logging.WARNING
            log.log(level, "rejected request %d: %s", request.id, problem)
            return p.Reply(id=request.id, ok=False, error=problem)
        deadline = request.deadline or time.time() + self.request_timeout_s
        try:
            body = await self._until_death(self._dispatch(request.body, request.id, deadline))
        except RequestRefused as exc:
            log.warning("refused request %d (%s): %s", request.id, type(request.body).__name__, exc)
            return p.Reply(id=request.id, ok=False, error=str(exc))
        except Exception as exc:  # the request fails, the server stays up (unless the backend died)
            death = self.death or self.backend.failure()
            if death:
                return p.Reply(id=request.id, ok=False, error=f"{death}; the server is exiting")
            log.exception("request %d (%s) failed", request.id, type(request.body).__name__)
            return p.Reply(id=request.id, ok=False, error=f"{type(exc).__name__}: {exc}")
        return p.Reply(id=request.id, ok=True, body=body)

    def _reject_reason(self, request: p.Request) -> str:
        if self.death:
            return f"{self.death}; the server is exiting"
        if request.version != p.PROTOCOL_VERSION:
            return f"protocol version {request.version} is not {p.PROTOCOL_VERSION}; use a matching rlx on both sides"
        if self.token and not hmac.compare_digest(request.token.encode(), self.token.encode()):
            return "bad or missing auth token; set rollout.auth_token to the server's token"
        if request.deadline and request.deadline < time.time():
            return "deadline already passed when the request arrived"
        return ""

    async def _until_death(self, coro):
        """Await ``coro``, but raise ``BackendDied`` (cancelling it) as soon as the backend dies."""
        work = asyncio.ensure_future(coro)
        died = asyncio.ensure_future(self._died.wait())
        try:
            await asyncio.wait({work, died}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            died.cancel()
        if work.done():
            return work.result()
        work.cancel()
        raise BackendDied(f"{self.death}; the server is exiting")

    async def _dispatch(self, body, request_id: int, deadline: float):
        if isinstance(body, p.Generate):
            return await self._generate(body, request_id, deadline)
        if isinstance(body, p.ScoreTokens):
            problem = p.score_problem(body, self.max_model_len, self.backend.vocab_size)
            if problem:
                raise RequestRefused(problem)
            return p.ScoreResult(logprobs=await self.backend.score(body.token_ids, body.start))
        if isinstance(body, p.Health):
            return p.HealthResult(
                backend=self.backend.name,
                model=self.backend.model_path,
                paused=self.paused,
                weight_version=self.weight_version,
                startup=startup.marks(),
            )
        if isinstance(body, p.Stats):
            return p.StatsResult(
                in_flight=self.in_flight,
                completed=self.completed,
                generated_tokens=self.generated_tokens,
                paused=self.paused,
                weight_version=self.weight_version,
                uptime_s=time.time() - self.started,
            )
        if isinstance(body, p.Pause):
            await self.backend.pause()
            self.paused = True
            return p.Ok()
        if isinstance(body, p.Resume):
            if body.weight_version >= 0:  # the backend labels tokens with it from the resume on
                self.weight_version = self.backend.weight_version = body.weight_version
            await self.backend.resume()
            self.paused = False
            return p.Ok()
        if isinstance(body, p.Shutdown):
            self._stop.set()
            return p.Ok()
        if isinstance(body, p.TakeEpisodes):
            if self.episodes is None:
                raise RequestRefused(
                    "this server records no episodes; start it with --openai-port (or set "
                    "rollout.openai_port) so an agent can drive episodes over HTTP"
                )
            return p.EpisodesResult(episodes=self.episodes.take(body.max_episodes, body.group_size))
        if isinstance(body, (p.Sleep, p.WakeUp)):
            return await self._sleep_or_wake(body)
        return p.AckResult(ack=await self._update(body.payload))

    async def _generate(self, body: p.Generate, request_id: int, deadline: float) -> p.GenerateResult:
        problem = p.generate_problem(body, self.max_model_len, self.backend.vocab_size)
        if problem:
            raise RequestRefused(problem)
        prompts = list(body.prompt_token_ids) or list(body.prompts)
        samplings = [self._fitted(prompt, i, body.sampling) for i, prompt in enumerate(prompts)]
        self.in_flight += len(prompts)
        served = f"{tracer.name}:{next(self._generates)}" if tracer.name else str(next(self._generates))
        ids = [f"{served}.{i}" for i in range(len(prompts))]
        for rid in ids:
            tracer.event("queued", request_id=rid, paused=self.paused)
        try:
            together = max(body.together, len(prompts))
            # asyncio.timeout, not wait_for: when the server stops and cancels this request, the gather's
            # outcome is retrieved here rather than left for the loop to log as never retrieved.
            async with asyncio.timeout(max(deadline - time.time(), 0.0)):
                results = await asyncio.gather(
                    *(
                        self._generate_one(prompt, sampling, rid, deadline, together)
                        for prompt, sampling, rid in zip(prompts, samplings, ids, strict=True)
                    )
                )
        except TimeoutError:
            raise RequestRefused(
                f"request {request_id} reached its deadline while generating; it was cancelled "
                "(raise the client's timeout or lower max_tokens)"
            ) from None
        finally:
            self.in_flight -= len(prompts)
        self.completed += len(prompts)
        return p.GenerateResult(results=list(results))

    def _fitted(self, prompt, index: int, sampling: p.SamplingSpec) -> p.SamplingSpec:
        """``sampling`` with ``max_tokens`` capped to the room ``prompt`` leaves in the context."""
        length = self.backend.prompt_len(prompt)
        if length < 1:
            raise RequestRefused(f"prompt {index} is empty (0 tokens); every prompt needs at least one token")
        room = self.max_model_len - length
        if room < 1:
            raise RequestRefused(
                f"prompt {index} is {length} tokens; it must be shorter than "
                f"rollout.max_model_len={self.max_model_len} (the context length) "
                "to leave room for a completion"
            )
        return msgspec.structs.replace(sampling, max_tokens=min(sampling.max_tokens, room))

    async def _generate_one(
        self, prompt, sampling: p.SamplingSpec, request_id: str, deadline: float, together: int = 0
    ) -> p.PromptResult:
        with tracer.span("generate", request_id=request_id, n=sampling.n) as span:
            result = await self.backend.generate(prompt, sampling, deadline, together)
            tokens = sum(len(s.token_ids) for s in result.samples)
            span.set(
                prompt_tokens=len(result.prompt_token_ids),
                completion_tokens=tokens,
                finish_reason=result.samples[0].finish_reason if result.samples else "",
            )
        self.generated_tokens += tokens
        return result

    async def _sleep_or_wake(self, body) -> p.MemoryResult:
        """Sleep or WakeUp (colocated placement), one at a time with weight updates; traced as engine.sleep /
        engine.wake_up with the memory the phase that just ended peaked at."""
        sleep = isinstance(body, p.Sleep)
        if sleep and body.level not in (1, 2):
            raise RequestRefused(
                f"sleep level {body.level} is not 1 (weights to CPU, free the KV cache) or 2 (free both)"
            )
        if not sleep and not set(body.tags) <= {"weights", "kv_cache"}:
            raise RequestRefused(
                f"wake_up tags {list(body.tags)} must be among 'weights' and 'kv_cache' (empty = both)"
            )
        async with self._update_lock:
            _, peak_gb = await self.backend.memory_gb()  # the phase that ends here
            with tracer.span("engine.sleep" if sleep else "engine.wake_up", peak_memory_gb=peak_gb) as span:
                asleep = await (self.backend.sleep(body.level) if sleep else self.backend.wake_up(list(body.tags)))
                now_gb, _ = await self.backend.memory_gb()
                span.set(asleep=",".join(asleep), memory_gb=now_gb)
            return p.MemoryResult(asleep=asleep, memory_gb=now_gb, peak_memory_gb=peak_gb)

    async def _update(self, payload: bytes) -> BucketAck:
        """One weight-sync request, passed to the backend as it came; the ack says what happened."""
        async with self._update_lock:
            try:
                with tracer.span("sync.load") as span:
                    ack = await self.backend.update_weights(payload)
                    span.set(sync_id=ack.sync_id, bucket_id=ack.bucket_id, ok=ack.ok)
            finally:
                self._sync_touched = time.monotonic()
            self._sync_open = ack.in_sync
            if ack.completed:
                self.weight_version += 1
                tracer.event("sync.end", sync_id=ack.sync_id, weight_version=self.weight_version)
            if not ack.ok:
                tracer.event("sync.abort", sync_id=ack.sync_id, bucket_id=ack.bucket_id, error=ack.error)
                log.warning(
                    "weight update failed and was aborted: %s; the weights may mix old and new until the "
                    "next sync, generation goes on",
                    ack.error,
                )
            return ack

    async def _send(self, frames: list[bytes], reply: p.Reply) -> None:
        await self._sock.send_multipart(reply_frames(frames, p.encode(reply)))


def _ipc_file(address: str) -> tuple[Path, int] | None:
    """The path and inode of an ``ipc://`` address's socket file, or None (tcp, or no file)."""
    path = ipc_path(address)
    try:
        return (path, path.stat().st_ino) if path is not None else None
    except OSError:
        return None


async def run_server(backend: Backend, address: str, token: str = "", **limits) -> None:
    """Start ``backend`` and serve on ``address``; ``limits`` are ``RolloutServer``'s keyword arguments."""
    startup.mark("engine_start")
    with tracer.span("rollout.start", backend=backend.name):
        await backend.start()
    startup.mark("engine_ready")
    await RolloutServer(backend, address, token, **limits).serve()
