"""The sample store across hosts: rank 0 keeps its rows and serves them over TCP (``store.transport=tcp``).

The producer holds its rows exactly as the ``shm`` transport does (one segment on its own host, the
same ring, the same release rules) and answers readers from a background thread over a ZeroMQ
ROUTER socket bound on its host: ``MASTER_ADDR``'s interface (the address every trainer rank already
reaches for the rendezvous) at a free port. The address travels in the ``StoreHandle`` inside the
step's fixed-size notice, so rank 0's control bytes per step do not change.

Wire format (no pickle anywhere): a request is ``[request_id (8 bytes), Request]`` (msgspec/msgpack);
the reply is ``[request_id, Reply, *buffers]``: a msgspec header naming each buffer's dtype and
shape, then one frame of raw bytes per tensor (``get``: prompt ids, completion ids, logprobs, loss
mask and, when present, versions of each row; ``meta``: the rows' table entries). A released row
(or one never put) gets an error reply that the reader raises as ``RowGone``, as in ``shm``; a bad
or missing token gets a refusal naming the key to set; a malformed request gets an error reply and
the server stays up. A request names at most ``store.max_rows`` rows, each once (the reader folds
repeats), so one request holds the server's thread for at most one store's worth of rows; a request
too large to be one of those (``max_request_bytes``) disconnects its sender unread.

Auth follows the rollout servers: on loopback no token is needed; binding any other interface needs
the run's token (``rollout.auth_token``, which the launchers hand every process in
``RLX_ROLLOUT_AUTH_TOKEN``), compared with ``hmac.compare_digest``. The token never travels in the
notice. Every reader wait has a deadline (``store.timeout_s``) and its error names the producer.

The reader is a synchronous DEALER with a request-id frame, the convention of ``rlx.rpc``;
that helper itself is not used because it is asyncio-only and carries one payload frame, while
trainer ranks are synchronous and replies carry one raw frame per tensor.

Left out: several producers, IPv6 MASTER_ADDR literals, and compression.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import socket
import threading
import time

import msgspec
import numpy as np
import torch
import zmq

from rlx import rpc
from rlx.config.redact import SECRET_ENV
from rlx.net import is_loopback_host
from rlx.store.base import RowGone, Sample, SampleStore, StoreHandle, StoreReader
from rlx.store.shm import _ROW, ShmStore

log = logging.getLogger(__name__)

VERSION = 1
TOKEN_ENV = SECRET_ENV["rollout.auth_token"]
_POLL_MS = 100
MAX_TOKEN_BYTES = 64 << 10
"""Room for the auth token in a request's bytes (``max_request_bytes``)."""
_DTYPES = {"<i8": torch.long, "<f4": torch.float32, "|u1": torch.uint8, "<i2": torch.int16}  # int: MoE routes


class Request(msgspec.Struct, array_like=True):
    version: int
    op: str  # "get" | "meta"
    rows: list[int]
    token: str = ""


class TensorSpec(msgspec.Struct, array_like=True):
    dtype: str  # numpy dtype string ("<i8", "<f4"; "row" for table entries)
    shape: list[int]


class RowHead(msgspec.Struct, array_like=True):
    reward: float
    prompt_id: int
    group: int
    status: int
    has_versions: bool
    has_routes: bool = False


class Reply(msgspec.Struct, array_like=True):
    version: int
    error: str = ""  # empty on success
    error_kind: str = ""  # "row_gone" | "auth" | "bad_request"
    rows: list[RowHead] = []
    tensors: list[TensorSpec] = []


class StoreRefused(RuntimeError):
    """The producer refused a request (bad token, malformed request); the message names the fix."""


def token_from_env() -> str:
    return os.environ.get(TOKEN_ENV, "")


def bind_host(host: str | None) -> str:
    """The IPv4 address to bind: ``host``, else MASTER_ADDR, else loopback."""
    host = host or os.environ.get("MASTER_ADDR", "") or "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ValueError(
            f"store.transport=tcp binds rank 0's host {host!r} (MASTER_ADDR), which does not resolve "
            f"({exc}); set MASTER_ADDR to rank 0's IP address"
        ) from None


class TcpStore(SampleStore):
    """Rank 0's rows in a local ``ShmStore``, served to readers on other hosts by a background thread.

    Socket invariants (ROUTER, bound here, used only by the server thread): readers connect; one
    request is answered at once, in order; ``LINGER=0`` so ``close`` never waits on a reader that
    went away; a reader that stops reading only fills its own queue (high-water mark), which drops
    replies to it rather than blocking the others.
    """

    def __init__(
        self,
        capacity_bytes: int,
        max_rows: int,
        host: str | None = None,
        token: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        ip = bind_host(host)
        self.token = token_from_env() if token is None else token
        if not is_loopback_host(ip) and not self.token:
            raise ValueError(
                f"store.transport=tcp serves rows on {ip}, which is not loopback, and needs an auth "
                f"token: set rollout.auth_token (rlx train hands it to every rank as {TOKEN_ENV}), or export "
                f"{TOKEN_ENV} on every trainer rank started another way"
            )
        self.timeout_s = timeout_s
        self._rows = ShmStore(capacity_bytes, max_rows)
        self._lock = threading.Lock()  # the server thread reads while the producer puts and releases
        self._socket = rpc.router(zmq.Context.instance(), None, hwm=1000, max_message_bytes=max_request_bytes(max_rows))
        port = self._socket.bind_to_random_port(f"tcp://{ip}")
        self.address = f"tcp://{ip}:{port}"
        self.requests_served = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rlx-store-tcp", daemon=True)
        self._thread.start()

    def put(self, samples: list[Sample]) -> list[int]:
        with self._lock:
            return self._rows.put(samples)

    def get(self, rows: list[int]) -> list[Sample]:
        with self._lock:
            return self._rows.get(rows)

    def meta(self, rows: list[int]) -> np.ndarray:
        with self._lock:
            return self._rows.meta(rows)

    def release(self, rows: list[int]) -> None:
        with self._lock:
            self._rows.release(rows)

    def handle(self) -> StoreHandle:
        return StoreHandle("tcp", self.address, 0, self._rows.max_rows, self.timeout_s)

    def stats(self) -> dict[str, float]:
        with self._lock:
            return self._rows.stats()

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._rows.close()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._socket.poll(_POLL_MS):
                    continue
                frames = self._socket.recv_multipart()
                self._socket.send_multipart([*frames[:-1], *self._answer(frames[-1])])
                self.requests_served += 1
        finally:
            self._socket.close(linger=0)

    def _answer(self, payload: bytes) -> list:
        try:
            request = msgspec.msgpack.decode(payload, type=Request)
        except msgspec.DecodeError as exc:
            log.warning("sample store: malformed request (%s)", exc)
            return [_error(f"malformed sample store request: {exc}", "bad_request")]
        if self.token and not hmac.compare_digest(request.token.encode(), self.token.encode()):
            log.warning("sample store: refused a request with a bad or missing auth token")
            return [
                _error(
                    "bad or missing auth token; set rollout.auth_token (or "
                    f"{TOKEN_ENV}) on every trainer rank to rank 0's token",
                    "auth",
                )
            ]
        if request.version != VERSION or request.op not in ("get", "meta"):
            return [
                _error(
                    f"sample store request version {request.version} op {request.op!r}; this rank 0 "
                    f"serves version {VERSION}, ops get and meta (every rank must run the same rlx)",
                    "bad_request",
                )
            ]
        problem = rows_problem(request.rows, self._rows.max_rows)
        if problem:
            log.warning("sample store: refused a request (%s)", problem)
            return [_error(problem, "bad_request")]
        try:
            if request.op == "meta":
                entries = self.meta(request.rows)
                return [
                    msgspec.msgpack.encode(Reply(VERSION, tensors=[TensorSpec("row", [len(entries)])])),
                    entries.tobytes(),
                ]
            return _encode_samples(self.get(request.rows))
        except RowGone as exc:
            return [_error(str(exc), "row_gone")]
        except Exception as exc:  # noqa: BLE001 - one bad request fails itself; the server stays up
            log.warning("sample store: %s failed (%s)", request.op, exc)
            return [_error(f"{request.op} of rows {request.rows[:4]}... failed on rank 0: {exc}", "bad_request")]


def max_request_bytes(max_rows: int) -> int:
    """The largest request a reader sends: ``max_rows`` row ids (at most 9 msgpack bytes each) and a token."""
    return 9 * max_rows + MAX_TOKEN_BYTES


def rows_problem(rows: list[int], max_rows: int) -> str:
    """Why a request for ``rows`` is refused, or "": more rows than the store holds, or a row named twice (a
    reader asks for each row once; ``TcpStoreReader`` folds repeats itself)."""
    if len(rows) > max_rows:
        return (
            f"a request for {len(rows)} rows; rank 0's store holds at most {max_rows} (store.max_rows), so a "
            "request names at most that many rows"
        )
    repeats = len(rows) - len(set(rows))
    if repeats:
        return f"a request names {repeats} rows more than once; name each row once"
    return ""


def _error(message: str, kind: str) -> bytes:
    return msgspec.msgpack.encode(Reply(VERSION, error=message, error_kind=kind))


def _encode_samples(samples: list[Sample]) -> list:
    heads, specs, buffers = [], [], []
    for s in samples:
        routed = s.routes is not None
        heads.append(RowHead(s.reward, s.prompt_id, s.group, int(s.status), s.versions is not None, routed))
        tensors = [s.prompt_ids.long(), s.completion_ids.long(), s.logprobs.float(), s.mask().float()]
        if s.versions is not None:
            tensors.append(s.versions.long())
        if s.routes is not None:
            tensors.append(s.routes)
        for tensor in tensors:
            array = tensor.contiguous().numpy()
            specs.append(TensorSpec(array.dtype.str, list(array.shape)))
            buffers.append(memoryview(array).cast("B"))
    return [msgspec.msgpack.encode(Reply(VERSION, rows=heads, tensors=specs)), *buffers]


class TcpStoreReader(StoreReader):
    """A trainer rank's side: asks rank 0 for rows by id; every wait has the handle's deadline.

    Socket invariants (DEALER, connects): a request id frame matches the reply, so a late reply to a
    request that timed out is dropped; ``LINGER=0``; a dead or silent producer raises ``TimeoutError``
    naming it when the deadline passes.
    """

    def __init__(self, handle: StoreHandle, token: str | None = None) -> None:
        if not handle.name.startswith("tcp://"):
            raise ValueError(f"store handle names {handle.name!r}, which is not a tcp:// address")
        self.address = handle.name
        self.timeout_s = handle.timeout_s if handle.timeout_s > 0 else 60.0
        self.token = token_from_env() if token is None else token
        self._ids = itertools.count(1)
        self._socket = rpc.dealer(zmq.Context.instance(), self.address, hwm=1000)

    def get(self, rows: list[int]) -> list[Sample]:
        unique = list(dict.fromkeys(rows))  # each row crosses the wire once, however often it is asked for
        reply, buffers = self._call("get", unique)
        if len(reply.tensors) != len(buffers) or len(reply.rows) != len(unique):
            raise StoreRefused(
                f"rank 0's sample store at {self.address} sent {len(buffers)} buffers for "
                f"{len(reply.tensors)} tensors and {len(reply.rows)} rows for {len(unique)}"
            )
        tensors = iter(_tensor(spec, buffer, self.address) for spec, buffer in zip(reply.tensors, buffers, strict=True))
        samples = []
        for head in reply.rows:
            prompt, completion, logprobs, mask = next(tensors), next(tensors), next(tensors), next(tensors)
            versions = next(tensors) if head.has_versions else None
            routes = next(tensors) if head.has_routes else None
            samples.append(
                Sample(
                    prompt,
                    completion,
                    logprobs,
                    head.reward,
                    mask,
                    versions,
                    head.prompt_id,
                    head.group,
                    head.status,
                    routes,
                )
            )
        by_row = dict(zip(unique, samples, strict=True))
        return [by_row[row] for row in rows]

    def meta(self, rows: list[int]) -> np.ndarray:
        unique = list(dict.fromkeys(rows))
        _, buffers = self._call("meta", unique)
        entries = np.frombuffer(buffers[0], dtype=_ROW).copy() if buffers else np.zeros(0, dtype=_ROW)
        if len(entries) != len(unique):
            raise StoreRefused(
                f"rank 0's sample store at {self.address} sent {len(entries)} table entries for {len(unique)} rows"
            )
        at = {row: i for i, row in enumerate(unique)}
        return entries[[at[row] for row in rows]]

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def _call(self, op: str, rows: list[int]) -> tuple[Reply, list[bytes]]:
        payload = msgspec.msgpack.encode(Request(VERSION, op, [int(r) for r in rows], self.token))
        frames = rpc.call_blocking(self._socket, next(self._ids), payload, time.monotonic() + self.timeout_s)
        if frames is None:
            self._timeout(op)
        try:
            reply = msgspec.msgpack.decode(frames[0], type=Reply)
        except (IndexError, msgspec.DecodeError) as exc:
            raise StoreRefused(f"undecodable reply from rank 0's sample store at {self.address}: {exc}") from None
        if reply.error_kind == "row_gone":
            raise RowGone(reply.error)
        if reply.error:
            raise StoreRefused(f"rank 0's sample store at {self.address} refused {op}: {reply.error}")
        return reply, frames[1:]

    def _timeout(self, op: str):
        raise TimeoutError(
            f"rank 0's sample store at {self.address} did not answer {op} within {self.timeout_s:g} s: "
            "rank 0 is dead, hung or unreachable from this host (check its log, and that this "
            "host reaches MASTER_ADDR; store.timeout_s sets the deadline)"
        )


def _tensor(spec: TensorSpec, buffer: bytes, address: str) -> torch.Tensor:
    dtype = _DTYPES.get(spec.dtype)
    count = int(np.prod(spec.shape)) if spec.shape else 1
    if dtype is None or len(buffer) != count * np.dtype(spec.dtype).itemsize:
        raise StoreRefused(
            f"rank 0's sample store at {address} sent a {spec.dtype} tensor of shape {spec.shape} "
            f"in {len(buffer)} bytes"
        )
    return torch.from_numpy(np.frombuffer(buffer, dtype=spec.dtype).copy()).reshape(spec.shape)
