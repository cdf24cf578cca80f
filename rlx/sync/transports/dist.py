"""torch.distributed broadcast transport (across hosts): ``gloo`` on CPUs, ``nccl`` on GPUs.

Each sync is its own small world. The sender (rank 0) hosts a ``TCPStore`` for its lifetime;
``SyncBegin`` gives each receiver the store's address, a fresh group name, its rank and the world
size; sender and receivers then build a stateless process group over a ``PrefixStore``
(``ProcessGroupGloo`` / ``ProcessGroupNCCL`` made directly, never the default group, which the
trainer's own ranks use), and the group is aborted at ``SyncEnd`` or when the sync fails (the
rollout server's abort path closes the receiver, which aborts it). A world per sync rather than
one kept per server: a group with a dead member is dead for good, and a kept group needs both
sides to agree that it still lives; a fresh one costs one rendezvous per sync (milliseconds on a
LAN) and a failed sync can never poison the next one.

Bytes: the sender broadcasts every chunk straight from its source tensor (no slot, no copy); a
receiver receives every chunk straight into its destination when the consumer names one
(``WeightReceiver(assemble_into=...)``), else into its own slot memory, from which the consumer
copies (vLLM's ``load_weights``). Both sides post the broadcasts of a bucket in chunk order (the
process group matches collectives by sequence), so with two buffers the sender's broadcasts of
bucket k+1 are queued while the receiver still loads bucket k. Empty chunks are not broadcast.

Deadlines: the group's timeout is the sync's (``sync.timeout_s``), so a broadcast whose peer died
fails within it instead of hanging; the receiver's error names the sender, and the sender's
acknowledgement deadline names the receiver.

Addresses: the store listens on every interface of the sender's host; it advertises the address
that routes to the first receiver not on this host (127.0.0.1 when all are local), or
``RLX_SYNC_HOST`` when set (NAT, several networks). The group name travels only in the
token-checked ``SyncBegin``, but the bytes are not encrypted: sync over a trusted network.
``nccl`` is written the same way as ``gloo`` and is not exercised by the CPU test suite.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import secrets
import socket
from urllib.parse import urlparse

import torch

from rlx.rollout.addresses import is_loopback_host
from rlx.sync.errors import SyncError
from rlx.sync.messages import TransportHandle
from rlx.sync.transports.base import ReceiverMapping, SenderBuffer

DIST_TRANSPORTS = ("gloo", "nccl")
_PAYLOAD = ("host", "port", "group", "rank", "world_size", "timeout_s")


class DistBuffer(SenderBuffer):
    sends_from_source = True

    def __init__(self, kind: str, slot_bytes: int, num_slots: int, device: str = "cpu", timeout_s: float = 120.0):
        self.kind, self.slot_bytes, self.num_slots, self.timeout_s = kind, slot_bytes, num_slots, timeout_s
        self.device = _device(kind, device)
        self._store = None
        self._group = None
        self._join: dict | None = None  # the rendezvous of the sync in progress
        self._posting: list = []  # (work, source) of the bucket being sent
        self._works: dict[int, list] = {}  # slot -> its last bucket's (work, source)

    def slot(self, index: int) -> torch.Tensor:
        raise NotImplementedError("the dist transport sends each chunk from its source tensor; it has no slots")

    def handle(self) -> TransportHandle:
        raise NotImplementedError("the dist transport gives each receiver its own handle; call handles(peers)")

    def handles(self, peers: list[str]) -> list[TransportHandle]:
        """A new group for this sync: one handle per receiver (rank 1..n), in ``peers`` order."""
        self.end_sync()
        host = os.environ.get("RLX_SYNC_HOST") or advertised_host(peers)
        if self._store is None:
            from torch.distributed import TCPStore

            self._store = TCPStore(host, 0, None, True, _timedelta(self.timeout_s), wait_for_workers=False)
        group = f"rlx-sync-{os.getpid()}-{secrets.token_hex(6)}"
        self._join = {"host": host, "group": group, "world_size": len(peers) + 1, "peers": list(peers)}
        payload = {"host": host, "port": self._store.port, "group": group, "world_size": len(peers) + 1,
                   "timeout_s": self.timeout_s}
        return [TransportHandle(self.kind, self.slot_bytes, self.num_slots, dict(payload, rank=rank))
                for rank in range(1, len(peers) + 1)]

    async def connect(self, begun: list[asyncio.Task]) -> None:
        """Join the group (in a thread: the rendezvous waits for every receiver) while the receivers
        handle their ``SyncBegin``; a receiver that fails its begin fails this at once."""
        join = self._join
        assert join is not None, "handles() comes before connect()"
        from torch.distributed import PrefixStore

        joining = asyncio.ensure_future(asyncio.to_thread(
            new_group, self.kind, PrefixStore(join["group"], self._store), 0, join["world_size"], join["host"],
            self.timeout_s))
        await asyncio.wait([joining, *begun], return_when=asyncio.FIRST_EXCEPTION)
        for task in begun:
            if task.done() and not task.cancelled() and task.exception() is not None:
                joining.add_done_callback(_abort_late_group)
                raise task.exception()
        try:
            self._group = await joining
        except Exception as exc:  # noqa: BLE001 - any rendezvous failure is reported naming the receivers
            raise SyncError(f"the {self.kind} group {join['group']} did not form within {self.timeout_s:g} s "
                            f"(sync.timeout_s): {exc}; receivers: {', '.join(join['peers'])}") from None

    def send_chunk(self, source: torch.Tensor) -> None:
        if source.numel():
            self._posting.append((self._group.broadcast([source], _root()), source))

    def ready(self, index: int) -> None:
        """The bucket's broadcasts are posted; those of the last bucket in this slot are finished
        (every receiver acknowledged it), so their errors, if any, are raised here."""
        _wait_all(self._works.pop(index, []), self.timeout_s, f"the receivers of group {self._name()}")
        self._works[index], self._posting = self._posting, []

    def end_sync(self) -> None:
        works = [w for slot_works in self._works.values() for w in slot_works] + self._posting
        self._works, self._posting = {}, []
        group, self._group, self._join = self._group, None, None
        try:
            if group is not None:
                _wait_all(works, self.timeout_s, "the receivers")
        finally:
            _abort(group)

    def close(self) -> None:
        self._works, self._posting = {}, []
        group, self._group, self._join = self._group, None, None
        _abort(group)
        self._store = None

    def _name(self) -> str:
        return self._join["group"] if self._join else "(none)"


class DistMapping(ReceiverMapping):
    moves_bytes = True

    def __init__(self, handle: TransportHandle):
        from torch.distributed import PrefixStore, TCPStore

        self.handle = handle
        p = handle.payload
        missing = [k for k in _PAYLOAD if k not in p]
        if missing or not 1 <= int(p.get("rank", 0)) < int(p.get("world_size", 0)):
            raise ValueError(f"{handle.kind} handle lacks {', '.join(missing) or 'a rank below world_size'}: "
                             f"{sorted(p)}; run the same rlx version on both sides")
        self.peer = f"the sender at {p['host']}:{p['port']} (group {p['group']})"
        self.timeout_s = float(p["timeout_s"])
        self.device = _device(handle.kind, "cuda" if handle.kind == "nccl" else "cpu")
        try:
            store = TCPStore(p["host"], int(p["port"]), None, False, _timedelta(self.timeout_s))
            self._group = new_group(handle.kind, PrefixStore(p["group"], store), int(p["rank"]), int(p["world_size"]),
                                    route_to(p["host"]), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the store or group failed: one error naming the sender
            raise RuntimeError(f"cannot join {self.peer} within {self.timeout_s:g} s: {exc}; is the trainer "
                               "reachable from this host (firewall, RLX_SYNC_HOST)?") from None
        self._slots: torch.Tensor | None = None

    def slot(self, index: int) -> torch.Tensor:
        if self._slots is None:  # only chunks without a destination of their own land here
            self._slots = torch.empty(self.handle.slot_bytes * self.handle.num_slots, dtype=torch.uint8,
                                      device=self.device)
        return self._slots[index * self.handle.slot_bytes:(index + 1) * self.handle.slot_bytes]

    def fetch(self, index: int, pieces: list[tuple[int, torch.Tensor]]) -> None:
        """Receive each piece straight into its destination, in chunk order (the sender's order)."""
        if self._group is None:
            raise RuntimeError(f"the group with {self.peer} was closed")
        works = [(self._group.broadcast([dst], _root()), dst) for _, dst in pieces if dst.numel()]
        _wait_all(works, self.timeout_s, self.peer)

    def done_reading(self, index: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        group, self._group, self._slots = self._group, None, None
        _abort(group)


def new_group(kind: str, store, rank: int, world_size: int, local_host: str, timeout_s: float):
    """A stateless process group of ``world_size`` over ``store``; blocks until every rank joined."""
    from torch.distributed import ProcessGroupGloo

    if kind == "gloo":
        options = ProcessGroupGloo._Options()
        options._timeout = _timedelta(timeout_s)
        options._devices = [ProcessGroupGloo.create_device(hostname=local_host)]
        return ProcessGroupGloo(store, rank, world_size, options)
    from torch.distributed import ProcessGroupNCCL

    options = ProcessGroupNCCL.Options()
    options._timeout = _timedelta(timeout_s)
    group = ProcessGroupNCCL(store, rank, world_size, options)
    group.eager_connect_single_device(torch.device("cuda", torch.cuda.current_device()))
    return group


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


def _wait_all(works: list, timeout_s: float, peer: str) -> None:
    for work, _ in works:
        try:
            work.wait(_timedelta(timeout_s))
        except Exception as exc:  # noqa: BLE001 - gloo and nccl raise RuntimeError subclasses or DistError
            raise SyncError(f"broadcast with {peer} failed within {timeout_s:g} s (sync.timeout_s): "
                            f"{str(exc).splitlines()[0]}") from None


def _abort(group) -> None:
    if group is not None:
        group.abort()


def _abort_late_group(joining: asyncio.Future) -> None:
    if not joining.cancelled() and joining.exception() is None:
        _abort(joining.result())


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
