"""torch.distributed broadcast transport (across hosts): ``gloo`` on CPUs, ``nccl`` on GPUs.

A small world of the sender and its receivers. The sender (rank 0) hosts a ``TCPStore`` for its lifetime;
``SyncBegin`` gives each receiver the store's address, a group name, its rank and the world size; sender
and receivers build a stateless process group over a ``PrefixStore`` (``ProcessGroupGloo`` /
``ProcessGroupNCCL`` made directly, never the default group, which the trainer's own ranks use). The group
is kept after a sync that ended well and serves the next sync to the same receivers (``reuse`` in their
handles): no rendezvous, and NCCL's connections between the peers, which it makes at a group's first
broadcast (about 0.16 s between two H200s), are made once. Any failure drops it on both sides: the sender
aborts it (``close``), and a receiver's abort path closes its mappings; the next sync builds a new group,
so a failed sync never poisons the next one. A receiver that no longer holds a group the sender reuses (it
restarted, or keeps the groups of several senders and dropped this one) fails the begin at once, naming the
group; the sender then forms a new group within the same sync (``WeightSender`` waits for a reused group's
begins, which are quick, before the first bucket).

Bytes, ``nccl``: one broadcast per bucket. A bucket of several chunks is copied into the sender's slot
at its slot layout (one device copy per chunk) and broadcast whole into the receiver's slot, from which
each chunk is copied to its destination (``WeightReceiver(assemble_into=...)``) or read in place (vLLM's
``load_weights``): a model of hundreds of tensors costs one collective, and one completion wait, per
bucket rather than per tensor. The price is a device copy on each side (at device-memory bandwidth, a
small fraction of the broadcast's time) and ``num_buffers`` slots of memory on the sender's GPU. A
bucket of one chunk (a tensor as large as the bucket) is broadcast straight from its source into its
destination. ``gloo``: every chunk is broadcast straight from its source into its destination: on a
CPU the two extra copies cost more than the broadcasts they save (``rlx bench-sync --transport gloo``,
0.5b: 0.89x against 1.06x of the plain broadcast at 16 MiB buckets). The sender says which in the
handle (``coalesce``); both sides post a bucket's broadcasts in chunk order (the process group matches
collectives by sequence), and empty chunks are not sent. The sender posts a bucket's broadcasts only after its
meta is on the wire (``post``), so the receiver is already on its way to post its side: a post that
waits for its peer (NCCL may set up a connection at the first collective) can never wait on a meta that
is not sent. With two buffers the sender's broadcasts of bucket k+1 are queued while the receiver still
loads bucket k.

Deadlines, and nothing blocks where a signal must land: on the sender every gloo / NCCL call (the
rendezvous, the posts, the aborts) runs on the buffer's ``Lane``, one daemon thread, and the event loop
polls the broadcasts' completion; a receiver polls its own. Where a broadcast has not finished within
``sync.timeout_s`` the communicator is aborted (which frees a GPU kernel waiting on a dead peer) and
the sync fails naming the peer; the group's own timeout is longer, so torch's NCCL watchdog, which
would end the whole process, never fires first. A rendezvous that does not finish in time is left on
its thread (a daemon: it never holds the process at exit) and the next sync takes a new lane.

Addresses: the store listens on every interface of the sender's host; it advertises the address
that routes to the first receiver not on this host (127.0.0.1 when all are local), or
``RLX_SYNC_HOST`` when set (NAT, several networks). The group name travels only in the
token-checked ``SyncBegin``, but the bytes are not encrypted: sync over a trusted network.
``nccl`` is written the same way as ``gloo`` and is not exercised by the CPU test suite.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import datetime
import logging
import os
import queue
import secrets
import socket
import threading
import time
import weakref
from urllib.parse import urlparse

import torch

from rlx.net import is_loopback_host
from rlx.sync.copy import copy_bytes
from rlx.sync.errors import SyncError
from rlx.sync.messages import TransportHandle
from rlx.sync.transports.base import ReceiverMapping, SenderBuffer

log = logging.getLogger(__name__)

DIST_TRANSPORTS = ("gloo", "nccl")
_PAYLOAD = ("host", "port", "group", "rank", "world_size", "timeout_s")
GROUP_TIMEOUT_MARGIN_S = 60.0  # the group's own timeout exceeds the sync's: rlx's deadline fires first
POLL_S = 0.0005  # how often a wait looks at its broadcasts
CLOSE_WAIT_S = 10.0  # the longest a process waits at exit for its groups to be aborted


class Lane:
    """One daemon thread running calls in order: a gloo / NCCL call that waits on a peer without bound
    blocks this thread, never the caller's event loop or its signal handlers."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = _started(threading.Thread(target=self._run, name=name, daemon=True))

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def close(self) -> None:
        """No more calls; those queued still run (the process waits for them at exit, ``_join_at_exit``)."""
        self._calls.put(None)

    @classmethod
    def one_call(cls, name: str, fn, *args) -> concurrent.futures.Future:
        """``fn(*args)`` on a daemon thread of its own, which ends once it returns."""
        lane = cls(name)
        future = lane.submit(fn, *args)
        lane.close()
        return future

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)


class DistBuffer(SenderBuffer):
    sends_from_source = True

    def __init__(self, kind: str, slot_bytes: int, num_slots: int, device: str = "cpu", timeout_s: float = 120.0):
        self.kind, self.slot_bytes, self.num_slots, self.timeout_s = kind, slot_bytes, num_slots, timeout_s
        self.device = _device(kind, device)
        self.coalesce = kind == "nccl"  # a bucket of several chunks goes out as one broadcast of its slot
        self._store = None
        self._group = None
        self._lane: Lane | None = None
        self._join: dict | None = None  # the group of this sync (kept from the last): its payload and its peers
        self._filling: list[tuple[int, torch.Tensor]] = []  # the bucket being filled: (offset in its slot, chunk)
        self._slots: torch.Tensor | None = None  # coalesced buckets, made at the first one
        self._staged: dict[int, list[torch.Tensor]] = {}  # slot -> its bucket's chunks, until its meta is out
        self._posted: list[concurrent.futures.Future] = []  # each bucket's posts: their works and sources

    def slot(self, index: int) -> torch.Tensor:
        raise NotImplementedError("the dist transport sends each chunk from its source tensor; it has no slots")

    def handle(self) -> TransportHandle:
        raise NotImplementedError("the dist transport gives each receiver its own handle; call handles(peers)")

    def handles(self, peers: list[str], fresh: bool = False) -> list[TransportHandle]:
        """One handle per receiver (rank 1..n), in ``peers`` order: the group of the last sync when it ended well
        and goes to the same receivers (``reuse``: no rendezvous, no new connections), else (or ``fresh``) a new
        group."""
        join = self._join
        if not fresh and self._group is not None and join is not None and join["peers"] == list(peers):
            self.reusing = True
            payload = {key: value for key, value in join.items() if key != "peers"} | {"reuse": True}
            return [
                TransportHandle(self.kind, self.slot_bytes, self.num_slots, dict(payload, rank=rank))
                for rank in range(1, len(peers) + 1)
            ]
        self._drop_group()
        host = os.environ.get("RLX_SYNC_HOST") or advertised_host(peers)
        if self._store is None:
            from torch.distributed import TCPStore

            self._store = TCPStore(host, 0, None, True, _timedelta(self.timeout_s), wait_for_workers=False)
        group = f"rlx-sync-{os.getpid()}-{secrets.token_hex(6)}"
        payload = {
            "host": host,
            "port": self._store.port,
            "group": group,
            "world_size": len(peers) + 1,
            "timeout_s": self.timeout_s,
            "coalesce": self.coalesce,
        }
        self._join = dict(payload, peers=list(peers))
        return [
            TransportHandle(self.kind, self.slot_bytes, self.num_slots, dict(payload, rank=rank))
            for rank in range(1, len(peers) + 1)
        ]

    async def connect(self, begun: list[asyncio.Task]) -> None:
        """Join the group (on the lane: the rendezvous waits for every receiver) while the receivers
        handle their ``SyncBegin``; a receiver that fails its begin fails this at once. A kept group is
        joined already (its receivers' begins are awaited before the first bucket, as always)."""
        if self.reusing:
            return
        join = self._join
        assert join is not None, "handles() comes before connect()"
        from torch.distributed import PrefixStore

        if self._lane is None:
            self._lane = Lane(f"rlx-{self.kind}-sync")
        joining = asyncio.wrap_future(
            self._lane.submit(
                new_group,
                self.kind,
                PrefixStore(join["group"], self._store),
                0,
                join["world_size"],
                join["host"],
                self.timeout_s,
                self.device,
            )
        )
        done, _ = await asyncio.wait([joining, *begun], timeout=self.timeout_s, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in begun if t.done() and not t.cancelled() and t.exception() is not None]
        if failed or joining not in done:
            joining.add_done_callback(_abort_late_group)
            self._abandon_lane()
            if failed:
                raise failed[0].exception()
            raise SyncError(
                f"the {self.kind} group {join['group']} did not form within {self.timeout_s:g} s "
                f"(sync.timeout_s); receivers: {', '.join(join['peers'])}"
            )
        try:
            self._group = joining.result()
        except Exception as exc:  # noqa: BLE001 - any rendezvous failure is reported naming the receivers
            raise SyncError(
                f"the {self.kind} group {join['group']} did not form within {self.timeout_s:g} s "
                f"(sync.timeout_s): {exc}; receivers: {', '.join(join['peers'])}"
            ) from None

    def send_chunk(self, source: torch.Tensor, offset: int) -> None:
        if source.numel():
            self._filling.append((offset, source))

    def ready(self, index: int) -> None:
        """The bucket is complete: several chunks are copied into slot ``index`` at their offsets; what is
        sent waits for ``post`` (after the bucket's meta went out)."""
        chunks, self._filling = self._filling, []
        if len(chunks) > 1 and self.coalesce:
            self._staged[index] = [self._packed(index, chunks)]
        else:
            self._staged[index] = [source for _, source in chunks]

    def _packed(self, index: int, chunks: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """The slot's bytes up to the bucket's last chunk, each chunk copied to its offset (the sender
        reuses a slot only once every receiver acknowledged the bucket before in it)."""
        if self._slots is None:
            self._slots = torch.empty(self.slot_bytes * self.num_slots, dtype=torch.uint8, device=self.device)
        slot = self._slots[index * self.slot_bytes : (index + 1) * self.slot_bytes]
        for offset, source in chunks:
            copy_bytes(slot[offset : offset + source.numel()], source)
        return slot[: packed_span(chunks)]

    def post(self, index: int) -> None:
        """The bucket's meta is on the wire: post its broadcasts on the lane, in chunk order."""
        chunks = self._staged.pop(index, [])
        if chunks:
            self._posted.append(self._lane.submit(_post_all, self._group, chunks))

    async def end_sync(self) -> None:
        """Every receiver acknowledged ``SyncEnd``: wait (polling, within ``sync.timeout_s``) until the
        sender's broadcasts finished too. The group is kept for the next sync to the same receivers; a failure
        aborts it (and ``close``, which the sender calls on any failure of the sync)."""
        posted, self._posted = self._posted, []
        deadline = time.monotonic() + self.timeout_s
        try:
            for future in posted:
                works = await asyncio.wait_for(asyncio.wrap_future(future), max(deadline - time.monotonic(), 0.001))
                await wait_works(works, deadline, f"the receivers of group {self._name()}")
        except SyncError:
            self._drop_group(abandon=True)
            raise
        except TimeoutError:
            name = self._name()
            self._drop_group(abandon=True)
            raise SyncError(
                f"broadcasts to the receivers of group {name} were not posted within "
                f"{self.timeout_s:g} s (sync.timeout_s)"
            ) from None

    def close(self) -> None:
        self._filling, self._staged, self._posted, self._slots = [], {}, [], None
        self._drop_group()
        self._abandon_lane()
        self._store = None

    def _drop_group(self, abandon: bool = False) -> None:
        """Abort the group of the sync that ends (on the lane, after the posts: it never blocks here);
        ``abandon``: the lane may be stuck, so the abort runs on a thread of its own and the lane is left."""
        group, self._group, self._join, self.reusing = self._group, None, None, False
        if group is None:
            return
        if abandon or self._lane is None:
            abort_soon(group)
            self._abandon_lane()
        else:
            self._lane.submit(_abort_logged, group)

    def _abandon_lane(self) -> None:
        if self._lane is not None:
            self._lane.close()  # it ends after the call it is stuck in, if that ever returns
            self._lane = None

    def _name(self) -> str:
        return self._join["group"] if self._join else "(none)"


class DistMapping(ReceiverMapping):
    moves_bytes = True
    keep_mapped = True  # the group outlives the sync: the receiver keeps it for the sender's next one

    def __init__(self, handle: TransportHandle):
        self.handle = handle
        p = handle.payload
        missing = [k for k in _PAYLOAD if k not in p]
        if missing or not 1 <= int(p.get("rank", 0)) < int(p.get("world_size", 0)):
            raise ValueError(
                f"{handle.kind} handle lacks {', '.join(missing) or 'a rank below world_size'}: "
                f"{sorted(p)}; run the same rlx version on both sides"
            )
        if p.get("reuse"):
            raise ValueError(
                f"the sender reuses its {handle.kind} group {p['group']}, which this receiver does not hold (it "
                "restarted, or dropped the group); the sender forms a new group"
            )
        self.peer = f"the sender at {p['host']}:{p['port']} (group {p['group']})"
        self.timeout_s = float(p["timeout_s"])
        self.device = _device(handle.kind, "cuda" if handle.kind == "nccl" else "cpu")
        self.coalesce = bool(p.get("coalesce", False))
        self._slots: torch.Tensor | None = None
        joining = Lane.one_call(f"rlx-{handle.kind}-join", self._join, p)
        try:  # on a thread of its own: a rendezvous whose sender died may never return
            self._group = joining.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            joining.add_done_callback(_abort_late_group)
            raise RuntimeError(
                f"cannot join {self.peer} within {self.timeout_s:g} s (sync.timeout_s): the "
                "rendezvous did not finish; is the trainer alive and reachable from this host "
                "(firewall, RLX_SYNC_HOST)?"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the store or group failed: one error naming the sender
            raise RuntimeError(
                f"cannot join {self.peer} within {self.timeout_s:g} s: {exc}; is the trainer "
                "reachable from this host (firewall, RLX_SYNC_HOST)?"
            ) from None

    def _join(self, p: dict):
        from torch.distributed import PrefixStore, TCPStore

        store = TCPStore(p["host"], int(p["port"]), None, False, _timedelta(self.timeout_s))
        return new_group(
            self.handle.kind,
            PrefixStore(p["group"], store),
            int(p["rank"]),
            int(p["world_size"]),
            route_to(p["host"]),
            self.timeout_s,
            self.device,
        )

    def slot(self, index: int) -> torch.Tensor:
        if self._slots is None:  # only chunks without a destination of their own land here
            self._slots = torch.empty(
                self.handle.slot_bytes * self.handle.num_slots, dtype=torch.uint8, device=self.device
            )
        return self._slots[index * self.handle.slot_bytes : (index + 1) * self.handle.slot_bytes]

    def fetch(self, index: int, pieces: list[tuple[int, torch.Tensor]]) -> None:
        """Several pieces of a coalescing sender: receive the bucket into slot ``index`` in one broadcast, then copy
        each piece that is not the slot range itself to its destination. One piece: receive it straight into its
        destination."""
        live = [(offset, dst) for offset, dst in pieces if dst.numel()]
        if len(live) <= 1 or not self.coalesce:
            self.fetch_each([dst for _, dst in live])
            return
        slot = self.slot(index)
        self.fetch_each([slot[: packed_span(live)]])
        for offset, dst in live:
            src = slot[offset : offset + dst.numel()]
            if dst.data_ptr() != src.data_ptr():
                copy_bytes(dst, src)

    def fetch_each(self, destinations: list[torch.Tensor]) -> None:
        """One broadcast into each destination, in order (the sender's order)."""
        if self._group is None:
            raise RuntimeError(f"the group with {self.peer} was closed")
        works = _post_all(self._group, destinations)
        try:
            wait_works_blocking(works, time.monotonic() + self.timeout_s, self.peer)
        except SyncError:
            group, self._group = self._group, None
            abort_soon(group)
            raise

    def done_reading(self, index: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def release_views(self) -> None:
        """Between syncs: the group (and its slots) stay; every tensor handed out was a copy or the consumer's own."""

    def close(self) -> None:
        group, self._group, self._slots = self._group, None, None
        abort_soon(group)


def new_group(kind: str, store, rank: int, world_size: int, local_host: str, timeout_s: float, device: torch.device):
    """A stateless process group of ``world_size`` over ``store`` on ``device``; blocks until every rank
    joined (NCCL: its communicator is made now, for ``device``, not at the first broadcast)."""
    from torch.distributed import ProcessGroupGloo

    timeout = _timedelta(timeout_s + GROUP_TIMEOUT_MARGIN_S)
    if kind == "gloo":
        options = ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [ProcessGroupGloo.create_device(hostname=local_host)]
        return ProcessGroupGloo(store, rank, world_size, options)
    from torch.distributed import ProcessGroupNCCL

    torch.cuda.set_device(device)  # this thread's device: NCCL binds the communicator to it
    options = ProcessGroupNCCL.Options()
    options._timeout = timeout
    group = ProcessGroupNCCL(store, rank, world_size, options)
    group.eager_connect_single_device(device)
    return group


def packed_span(pieces: list[tuple[int, torch.Tensor]]) -> int:
    """The bytes of a slot that a bucket of ``(offset, bytes)`` pieces occupies: up to its last byte."""
    return max(offset + piece.numel() for offset, piece in pieces)


def _post_all(group, tensors: list[torch.Tensor]) -> list:
    """Post one broadcast from rank 0 per tensor, in order; (work, tensor) pairs keep each tensor alive
    until its broadcast finished."""
    return [(group.broadcast([t], _root()), t) for t in tensors]


async def wait_works(works: list, deadline: float, peer: str) -> None:
    """Until every broadcast of ``works`` finished, polling from the event loop; ``SyncError`` naming
    ``peer`` when one failed or ``deadline`` (``time.monotonic``) passed."""
    for work, _ in works:
        while not _finished(work, peer, deadline):
            await asyncio.sleep(POLL_S)
        work.wait()  # the stream that reads the tensor next waits for the broadcast (no CPU wait: it is done)


def wait_works_blocking(works: list, deadline: float, peer: str) -> None:
    """``wait_works`` for a caller outside an event loop (a receiver)."""
    for work, _ in works:
        while not _finished(work, peer, deadline):
            time.sleep(POLL_S)
        work.wait()


def _finished(work, peer: str, deadline: float) -> bool:
    try:
        if work.is_completed():
            return True
    except Exception as exc:  # noqa: BLE001 - gloo and nccl raise RuntimeError subclasses or DistError
        raise SyncError(f"broadcast with {peer} failed: {str(exc).splitlines()[0]}") from None
    if time.monotonic() > deadline:
        raise SyncError(
            f"broadcast with {peer} did not finish within the sync's deadline (sync.timeout_s); its group is aborted"
        )
    return False


def abort_soon(group) -> None:
    """Abort ``group`` on a daemon thread: an abort of a communicator whose peer is stuck may itself take
    time, and must not hold the caller (a deadline, a signal handler's teardown)."""
    if group is not None:
        _started(threading.Thread(target=_abort_logged, args=(group,), name="rlx-sync-abort", daemon=True))


_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def _started(thread: threading.Thread) -> threading.Thread:
    _THREADS.add(thread)
    thread.start()
    return thread


@atexit.register
def _join_at_exit() -> None:
    """At exit, give the lanes and aborts still running up to ``CLOSE_WAIT_S`` in all: a group destroyed by its
    own thread, not by the interpreter's teardown (torch's NCCL threads do not survive that: the process aborts
    with "terminate called without an active exception"). One stuck for good is left behind."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    for thread in list(_THREADS):
        thread.join(max(deadline - time.monotonic(), 0.0))


def _abort_logged(group) -> None:
    try:
        group.abort()
    except Exception:  # noqa: BLE001 - the group is dropped either way
        log.debug("aborting a sync group failed", exc_info=True)


def advertised_host(peers: list[str]) -> str:
    """The address of this host that the first non-local peer reaches it by; 127.0.0.1 when every
    peer (``tcp://host:port`` or ``ipc://...``) is on this host."""
    for peer in peers:
        host = urlparse(peer).hostname if peer.startswith("tcp://") else None
        if host and not is_loopback_host(host):
            return route_to(host)
    return "127.0.0.1"


def route_to(host: str) -> str:
    """The local address the kernel would send from to reach ``host`` (no packet is sent)."""
    if is_loopback_host(host):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def _abort_late_group(joining) -> None:
    """A rendezvous given up on (an asyncio or a concurrent future): abort its group if it forms after all."""
    if not joining.cancelled() and joining.exception() is None:
        abort_soon(joining.result())


def _root():
    from torch.distributed import BroadcastOptions

    options = BroadcastOptions()
    options.rootRank = 0
    return options


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _device(kind: str, device: str) -> torch.device:
    if kind == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("transport nccl needs a CUDA GPU on both sides; use sync.transport=gloo on CPUs")
        return torch.device("cuda", torch.cuda.current_device())
    if kind != "gloo":
        raise ValueError(f"unknown dist transport {kind!r}; choose one of {', '.join(DIST_TRANSPORTS)}")
    return torch.device("cpu")
