"""Tools and rewards as worker processes: concurrent calls, each with a timeout and a memory limit.

``WorkerPool`` keeps ``num_workers`` processes (``rlx.agent.worker_main``), each started in
its own process group with RLIMIT_AS set to ``memory_mb``, and talks to them over stdin/stdout
pipes in length-prefixed msgpack (no pickle). A worker counts as started once it has said so;
``call("module:function", *args)`` waits for an idle worker, sends the call and waits at most ``timeout_s``:

- a call that raises (or passes its memory limit) answers ``CallResult(ok=False, kind="error")``;
- a worker that dies mid-call (a crash, ``os._exit``, a segfault) is ``kind="crashed"`` and is replaced;
- a call still running after ``timeout_s`` is ``kind="timeout"``: its worker's process group is
  killed by pid and a fresh worker takes its place;
- a string result is cut to ``max_output_chars`` inside the worker;
- what a worker prints (stdout and stderr, one pipe) is copied to this process's stderr, at most
  ``max_log_bytes`` per call; past that, one note says the output was cut, and the rest of the call's
  output is read and dropped (not kept anywhere), so a call that prints 100 MB neither floods the
  console and the run's logs nor blocks on a full pipe.

So a bad call costs its sample, never the run. Left out: CPU-time limits per call (the timeout
bounds wall time) and network isolation (the ``python`` tool adds that for code it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import sys
from dataclasses import dataclass
from typing import Any, Self

import msgspec

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict)
STARTUP_TIMEOUT_S = 60.0
_READ_BYTES = 1 << 16


@dataclass
class CallResult:
    ok: bool
    value: Any = None
    error: str = ""
    kind: str = ""
    """'' when ok; 'error' (the function raised), 'timeout' or 'crashed'."""


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process, name: str, max_log_bytes: int) -> None:
        self.process = process
        self.printed = 0
        """Bytes the worker printed during its current call (or start-up)."""
        self.forwarding = asyncio.ensure_future(self._forward(f"{name} worker {process.pid}", max_log_bytes))

    async def _forward(self, who: str, max_bytes: int) -> None:
        """Copy the worker's output to our stderr, ``max_bytes`` per call, until the worker is gone."""
        while chunk := await self.process.stderr.read(_READ_BYTES):
            room = max(max_bytes - self.printed, 0)
            _to_stderr(chunk[:room])
            if self.printed <= max_bytes < self.printed + len(chunk):
                _to_stderr(
                    f"\n[{who}: this call printed more than {max_bytes} bytes; the rest of its output is "
                    "dropped, not kept: raise agent.max_worker_output_bytes to see more]\n".encode()
                )
            self.printed += len(chunk)

    async def request(self, body: bytes) -> dict:
        self.process.stdin.write(struct.pack(">I", len(body)) + body)
        await self.process.stdin.drain()
        return await self.read()

    async def read(self) -> dict:
        header = await self.process.stdout.readexactly(4)
        (size,) = struct.unpack(">I", header)
        return _decoder.decode(await self.process.stdout.readexactly(size))

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # the worker and anything it started
        await self.process.wait()
        try:  # its last output, up to the pipe's end (a process it left behind may hold the pipe open)
            await asyncio.wait_for(asyncio.shield(self.forwarding), 1.0)
        except TimeoutError:
            self.forwarding.cancel()


def _to_stderr(data: bytes) -> None:
    """Write to file descriptor 2, where the worker's output went when it shared this process's stderr."""
    view = memoryview(data)
    while view:
        view = view[os.write(2, view) :]


class WorkerPool:
    def __init__(
        self,
        name: str,
        num_workers: int,
        timeout_s: float,
        memory_mb: int,
        max_output_chars: int = 4096,
        max_log_bytes: int = 65536,
    ) -> None:
        self.name, self.num_workers, self.timeout_s = name, num_workers, timeout_s
        self.memory_mb, self.max_output_chars, self.max_log_bytes = memory_mb, max_output_chars, max_log_bytes
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._closed = False
        self.replaced = 0
        """Workers killed (timeout) or lost (crash) and replaced so far."""

    async def start(self) -> WorkerPool:
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.num_workers)))
        for worker in workers:
            self._idle.put_nowait(worker)
        return self

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rlx.agent.worker_main",
            "--memory-mb",
            str(self.memory_mb),
            "--max-output-chars",
            str(self.max_output_chars),
            "--parent",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        worker = _Worker(process, self.name, self.max_log_bytes)
        self._all.add(worker)
        try:
            await asyncio.wait_for(worker.read(), STARTUP_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError) as exc:
            await worker.kill()
            self._all.discard(worker)
            raise RuntimeError(
                f"a {self.name} worker did not start within {STARTUP_TIMEOUT_S:g} s "
                f"(exit code {process.returncode}); see its stderr above"
            ) from exc
        return worker

    async def call(self, ref: str, *args: Any) -> CallResult:
        """Run ``ref`` (``module:function``) on ``args`` (msgpack-able values) in a worker."""
        worker = await self._idle.get()
        body = _encoder.encode({"fn": ref, "args": list(args)})
        worker.printed = 0
        try:
            reply = await asyncio.wait_for(worker.request(body), self.timeout_s)
        except TimeoutError:
            await self._replace(worker)
            return CallResult(False, error=f"{self.name} call timed out after {self.timeout_s:g} s", kind="timeout")
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
            code = await self._replace(worker)
            return CallResult(False, error=f"{self.name} worker crashed (exit code {code})", kind="crashed")
        except BaseException:  # cancelled mid-call: the worker's state is unknown, so it goes
            await asyncio.shield(self._replace(worker))
            raise
        self._idle.put_nowait(worker)
        if reply.get("ok"):
            return CallResult(True, reply.get("value"))
        return CallResult(False, error=str(reply.get("error", "")), kind="error")

    async def _replace(self, worker: _Worker) -> int | None:
        await worker.kill()
        self._all.discard(worker)
        if not self._closed:
            self.replaced += 1
            self._idle.put_nowait(await self._spawn())
        return worker.process.returncode

    async def close(self) -> None:
        """End every worker (by its process group), idle or busy."""
        self._closed = True
        workers, self._all = list(self._all), set()
        for worker in workers:
            if worker.process.stdin is not None and not worker.process.stdin.is_closing():
                worker.process.stdin.close()
        await asyncio.gather(*(w.kill() for w in workers), return_exceptions=True)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()
