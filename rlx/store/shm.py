"""The sample store in one POSIX shared-memory segment: the producer writes, readers map it.

The segment ``/dev/shm/rlx-store-<pid>-<hex>`` (mode 0600, reserved up front with
``posix_fallocate``) holds a row table of ``max_rows`` entries and a data region used as a ring:
each sample is one record (prompt ids, completion ids, logprobs, loss mask, versions), placed
after the newest one and reclaimed when it and every older row are released. A row's table
entry says where its record is; a released row's entry is cleared, so a reader asking for it gets
``RowGone`` rather than whatever sample reused the space.

Only the producer writes. A reader learns the rows to read from a message sent after they were
written (the trainer ranks: the rank bus broadcast), and the producer releases rows only after
every reader is done (the ranks' train step has finished), so no lock is needed.

Cleanup follows ``rlx.sync.transports.shm``: the producer unlinks the segment on ``close`` or at
interpreter exit; a killed producer's segment is removed by ``remove_stale_segments`` (called
before `rlx train` starts); readers only map. Left out: several producers on one segment.
"""

from __future__ import annotations

import collections
import os
import re

import numpy as np
import torch

from rlx.shm import SHM_DIR, close_mapping, create, open_segment, remove_dead_owners, tensor_over, unlink
from rlx.store.base import RowGone, Sample, SampleStore, StoreFull, StoreHandle, StoreReader

_NAME = re.compile(r"rlx-store-[0-9]+-[0-9a-f]+")
_ALIGN = 64
_ROW = np.dtype(
    [
        ("row_id", "<i8"),
        ("offset", "<i8"),
        ("prompt_len", "<i8"),
        ("completion_len", "<i8"),
        ("prompt_id", "<i8"),
        ("group", "<i8"),
        ("reward", "<f8"),
        ("loss_tokens", "<f8"),
        ("status", "<i4"),
        ("has_versions", "<i4"),
        ("route_tokens", "<i4"),  # MoE routes: [tokens, layers, top_k] of route_bytes-wide integers (0: none)
        ("route_layers", "<i4"),
        ("route_k", "<i4"),
        ("route_bytes", "<i4"),
    ]
)


def _layout(max_rows: int) -> int:
    """Byte offset of the data region (after the row table), aligned."""
    return -(-max_rows * _ROW.itemsize // _ALIGN) * _ALIGN


def _record_bytes(sample: Sample) -> int:
    return -(-sample.num_bytes // _ALIGN) * _ALIGN


class _Table:
    """The row table and data region over a mapped segment (shared by producer and readers)."""

    def __init__(self, mm, size: int, max_rows: int) -> None:
        self.bytes = tensor_over(mm)
        self.rows = np.frombuffer(mm, dtype=_ROW, count=max_rows)
        self.max_rows, self.data_start = max_rows, _layout(max_rows)
        self.data_size = size - self.data_start

    def read(self, row: int) -> Sample:
        entry = self.rows[row % self.max_rows]
        if int(entry["row_id"]) != row:
            raise RowGone(
                f"sample store row {row} was released (or never put); a consumer may only read rows "
                "announced to it and not yet released"
            )
        p, t = int(entry["prompt_len"]), int(entry["completion_len"])
        at = self.data_start + int(entry["offset"])

        def view(start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
            width = torch.tensor([], dtype=dtype).element_size()
            return self.bytes[at + start : at + start + count * width].view(dtype).clone()

        versions = view(8 * p + 16 * t, t, torch.long) if entry["has_versions"] else None
        routes = None
        if entry["route_tokens"]:
            shape = (int(entry["route_tokens"]), int(entry["route_layers"]), int(entry["route_k"]))
            dtype = torch.uint8 if entry["route_bytes"] == 1 else torch.int16
            start = 8 * p + (24 if entry["has_versions"] else 16) * t
            routes = view(start, shape[0] * shape[1] * shape[2], dtype).view(shape)
        return Sample(
            view(0, p, torch.long),
            view(8 * p, t, torch.long),
            view(8 * p + 8 * t, t, torch.float32),
            float(entry["reward"]),
            view(8 * p + 12 * t, t, torch.float32),
            versions,
            int(entry["prompt_id"]),
            int(entry["group"]),
            int(entry["status"]),
            routes,
        )

    def meta(self, rows: list[int]) -> np.ndarray:
        """The table entries of ``rows`` (a copy): lengths, reward, loss tokens, ids, status."""
        entries = self.rows[np.asarray(rows, dtype=np.int64) % self.max_rows].copy()
        gone = entries["row_id"] != np.asarray(rows)
        if gone.any():
            raise RowGone(f"sample store row {rows[int(np.argmax(gone))]} was released (or never put)")
        return entries

    def write(self, row: int, offset: int, sample: Sample) -> None:
        p, t = len(sample.prompt_ids), len(sample.completion_ids)
        at = self.data_start + offset
        parts = [
            (0, sample.prompt_ids, torch.long),
            (8 * p, sample.completion_ids, torch.long),
            (8 * p + 8 * t, sample.logprobs, torch.float32),
            (8 * p + 12 * t, sample.mask(), torch.float32),
        ]
        if sample.versions is not None:
            parts.append((8 * p + 16 * t, sample.versions, torch.long))
        if sample.routes is not None:
            start = 8 * p + (24 if sample.versions is not None else 16) * t
            parts.append((start, sample.routes.reshape(-1), sample.routes.dtype))
        for start, tensor, dtype in parts:
            width = torch.tensor([], dtype=dtype).element_size()
            self.bytes[at + start : at + start + len(tensor) * width].view(dtype).copy_(torch.as_tensor(tensor))
        entry = self.rows[row % self.max_rows]
        entry["offset"], entry["prompt_len"], entry["completion_len"] = offset, p, t
        entry["prompt_id"], entry["group"], entry["reward"] = sample.prompt_id, sample.group, sample.reward
        entry["status"], entry["has_versions"] = int(sample.status), sample.versions is not None
        entry["loss_tokens"] = float(sample.mask().sum())
        shape = sample.routes.shape if sample.routes is not None else (0, 0, 0)
        entry["route_tokens"], entry["route_layers"], entry["route_k"] = shape
        entry["route_bytes"] = sample.routes.element_size() if sample.routes is not None else 0
        entry["row_id"] = row  # last: the entry is whole once it names its row

    def clear(self, row: int) -> None:
        self.rows[row % self.max_rows]["row_id"] = -1

    def drop(self) -> None:
        self.bytes = self.rows = None


class ShmStore(SampleStore):
    def __init__(self, capacity_bytes: int, max_rows: int) -> None:
        if capacity_bytes < _ALIGN or max_rows < 1:
            raise ValueError(
                f"a sample store needs capacity >= {_ALIGN} bytes and max_rows >= 1 "
                f"(got {capacity_bytes} bytes, {max_rows} rows); raise store.capacity_mb / store.max_rows"
            )
        self.max_rows = max_rows
        self.size = _layout(max_rows) + -(-capacity_bytes // _ALIGN) * _ALIGN
        self.name = f"rlx-store-{os.getpid()}-{os.urandom(6).hex()}"
        self.path = os.path.join(SHM_DIR, self.name)
        self._mm = create(self.path, self.size)
        import weakref

        self._finalizer = weakref.finalize(self, unlink, self.path)
        self._table = _Table(self._mm, self.size, max_rows)
        self._table.rows["row_id"] = -1
        self._live: collections.OrderedDict[int, tuple[int, int, bool]] = collections.OrderedDict()
        self._next_row = 0
        self._head = 0  # data offset of the next record
        self._bytes_put = 0

    def put(self, samples: list[Sample]) -> list[int]:
        rows = []
        for sample in samples:
            nbytes = _record_bytes(sample)
            offset = self._allocate(nbytes)
            row = self._next_row
            self._table.write(row, offset, sample)
            self._live[row] = (offset, nbytes, False)
            self._next_row += 1
            self._bytes_put += sample.num_bytes
            rows.append(row)
        return rows

    def _allocate(self, nbytes: int) -> int:
        if len(self._live) >= self.max_rows:
            raise StoreFull(
                f"the sample store holds {len(self._live)} rows, its max; raise store.max_rows (or release rows sooner)"
            )
        size = self._table.data_size
        if not self._live:
            self._head = 0
        tail = next(iter(self._live.values()))[0] if self._live else 0
        if nbytes > size:
            raise StoreFull(f"one sample needs {nbytes} bytes, the store holds {size}; raise store.capacity_mb")
        if not self._live or self._head > tail:  # free: [head, size) then [0, tail)
            if self._head + nbytes <= size:
                return self._take(nbytes)
            if nbytes < tail:
                self._head = 0
                return self._take(nbytes)
        elif self._head + nbytes < tail:  # wrapped: free is [head, tail)
            return self._take(nbytes)
        raise StoreFull(
            f"the sample store's {size / 2**20:.1f} MiB are taken by {len(self._live)} unreleased "
            "rows; raise store.capacity_mb"
        )

    def _take(self, nbytes: int) -> int:
        offset = self._head
        self._head += nbytes
        return offset

    def get(self, rows: list[int]) -> list[Sample]:
        return [self._table.read(row) for row in rows]

    def meta(self, rows: list[int]) -> np.ndarray:
        return self._table.meta(rows)

    def release(self, rows: list[int]) -> None:
        for row in rows:
            if row in self._live:
                offset, nbytes, _ = self._live[row]
                self._live[row] = (offset, nbytes, True)
                self._table.clear(row)
        while self._live and next(iter(self._live.values()))[2]:
            self._live.popitem(last=False)

    def handle(self) -> StoreHandle:
        return StoreHandle("shm", self.name, self.size, self.max_rows)

    def stats(self) -> dict[str, float]:
        live = sum(nbytes for _, nbytes, released in self._live.values() if not released)
        put, self._bytes_put = self._bytes_put, 0
        return {
            "store_rows_live": float(sum(not r for *_, r in self._live.values())),
            "store_bytes_live": float(live),
            "store_occupancy": live / self._table.data_size,
            "store_bytes_put": float(put),
        }

    def close(self) -> None:
        self._finalizer()
        if self._mm is not None:
            self._table.drop()
            close_mapping(self._mm, self.path)
            self._mm = None


class ShmStoreReader(StoreReader):
    def __init__(self, handle: StoreHandle) -> None:
        if not _NAME.fullmatch(handle.name):
            raise ValueError(
                f"store handle names {handle.name!r}, which is not an rlx sample store segment (rlx-store-<pid>-<hex>)"
            )
        if handle.max_rows < 1 or handle.size <= _layout(handle.max_rows):
            raise ValueError(f"store handle size {handle.size} cannot hold a table of {handle.max_rows} rows")
        self.path = os.path.join(SHM_DIR, handle.name)
        self._mm = open_segment(self.path, handle.size)
        self._table = _Table(self._mm, handle.size, handle.max_rows)

    def get(self, rows: list[int]) -> list[Sample]:
        return [self._table.read(row) for row in rows]

    def meta(self, rows: list[int]) -> np.ndarray:
        return self._table.meta(rows)

    def close(self) -> None:
        if self._mm is not None:
            self._table.drop()
            close_mapping(self._mm, self.path)
            self._mm = None


def remove_stale_segments() -> list[str]:
    """Unlink the store segments of producers that no longer exist; one whose pid lives stays."""
    return remove_dead_owners("rlx-store-*", _NAME)
