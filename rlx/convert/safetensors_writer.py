"""Write safetensors shards tensor by tensor, and the index that names them.

The safetensors library writes a file from a dict of tensors that are all in memory; a
conversion instead knows every output tensor's name, dtype and shape before it reads any data,
so it writes the header first and then streams each tensor's bytes (in row chunks) behind it.
Peak memory is one chunk, whatever the shard size. The files are byte-compatible with the
library's (tests read them back with ``safetensors.safe_open``).

``ShardFile`` is the same file written out of order: once the header is down, every tensor's
byte range is known, so many threads can each ``pwrite`` their part of a tensor wherever it
belongs, with no ordering between them (the FP8 conversion works this way).

``model.safetensors.index.json`` is written only for more than one shard (as transformers does);
its ``total_size`` is the sum of the tensors' bytes.

Left out: reading (``safetensors_io``) and choosing names or dtypes (the callers).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlx.convert.safetensors_io import DTYPE_CODES, INDEX_NAME

ChunkSource = Callable[[], Iterable[torch.Tensor]]


@dataclass
class OutTensor:
    """One output tensor: its layout, and a function that yields its data as row chunks in order
    (None for a tensor written in parts through ``ShardFile``)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    chunks: ChunkSource | None
    sources: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.dtype.itemsize


@dataclass
class Shard:
    file_name: str
    tensors: list[OutTensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def plan_shards(tensors: list[OutTensor], shard_bytes: int, prefix: str = "model") -> list[Shard]:
    """Greedy: fill a shard up to ``shard_bytes``; a tensor larger than that gets a shard of its own."""
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if groups[-1] and size + tensor.nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += tensor.nbytes
    if len(groups) == 1:
        return [Shard(f"{prefix}.safetensors", groups[0])]
    total = len(groups)
    return [Shard(f"{prefix}-{i + 1:05d}-of-{total:05d}.safetensors", g) for i, g in enumerate(groups)]


def header_bytes(tensors: list[OutTensor], metadata: dict[str, str] | None = None) -> bytes:
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": DTYPE_CODES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def write_shard(
    path: Path, shard: Shard, on_bytes: Callable[[int], None] | None = None, metadata: dict[str, str] | None = None
) -> None:
    """Write one shard: header, then each tensor's chunks; fsync before returning."""
    with open(path, "wb") as f:
        f.write(header_bytes(shard.tensors, metadata))
        for tensor in shard.tensors:
            assert tensor.chunks is not None, f"{tensor.name} has no chunk source; write it with ShardFile"
            written = 0
            for chunk in tensor.chunks():
                written += _write_chunk(f, tensor, chunk)
                if on_bytes:
                    on_bytes(chunk.numel() * chunk.element_size())
            if written != tensor.nbytes:
                raise RuntimeError(f"{tensor.name}: produced {written} bytes, its header says {tensor.nbytes}")
        f.flush()
        os.fsync(f.fileno())


def _write_chunk(f, tensor: OutTensor, chunk: torch.Tensor) -> int:
    if chunk.dtype != tensor.dtype:
        raise RuntimeError(f"{tensor.name}: chunk dtype {chunk.dtype} != planned {tensor.dtype}")
    raw = chunk.detach().contiguous().reshape(-1).view(torch.uint8)
    f.write(memoryview(raw.numpy()))
    return raw.numel()


class ShardFile:
    """One output shard written at planned offsets, by any thread, in any order.

    ``write(name, offset, data)`` puts ``data`` at byte ``offset`` of tensor ``name``, and hands
    it to the disk at once (write-behind), so that writing overlaps the work still to come.
    ``close()`` checks that every tensor received exactly the bytes its header promises (a missing
    or repeated part is a bug, not a user error), then fsyncs. ``abort()`` only closes the file.
    """

    def __init__(self, path: Path, shard: Shard, metadata: dict[str, str] | None = None):
        header = header_bytes(shard.tensors, metadata)
        self.path = path
        self._ranges: dict[str, tuple[int, int, torch.dtype]] = {}
        offset = len(header)
        for tensor in shard.tensors:
            self._ranges[tensor.name] = (offset, tensor.nbytes, tensor.dtype)
            offset += tensor.nbytes
        self._written = dict.fromkeys(self._ranges, 0)
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _pwrite_all(self._fd, memoryview(header), 0)

    def write(self, name: str, offset: int, data: torch.Tensor) -> int:
        """Write ``data`` (the tensor's dtype, any shape) at byte ``offset`` of tensor ``name``."""
        start, nbytes, dtype = self._ranges[name]
        if data.dtype != dtype:
            raise RuntimeError(f"{name}: part dtype {data.dtype} != planned {dtype}")
        raw = data.detach().contiguous().reshape(-1).view(torch.uint8)
        if offset < 0 or offset + raw.numel() > nbytes:
            raise RuntimeError(f"{name}: part [{offset}, {offset + raw.numel()}) outside its {nbytes} bytes")
        _pwrite_all(self._fd, memoryview(raw.numpy()), start + offset)
        _write_behind(self._fd, start + offset, raw.numel())
        with self._lock:
            self._written[name] += raw.numel()
        return raw.numel()

    def close(self) -> None:
        short = [
            f"{n}: {self._written[n]} of {size} bytes"
            for n, (_, size, _) in self._ranges.items()
            if self._written[n] != size
        ]
        if short:
            self.abort()
            raise RuntimeError(f"{self.path.name}: tensors not written as planned: {'; '.join(short[:5])}")
        os.fsync(self._fd)
        self.abort()

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _write_behind(fd: int, offset: int, num_bytes: int) -> None:
    """Start writing these bytes to the disk now, without waiting: Linux's DONTNEED hint submits a
    range's dirty pages for writeback (and drops only pages already clean). Otherwise nothing is
    written before the dirty-page threshold, often gigabytes, and the final fsync does it all."""
    with contextlib.suppress(OSError, AttributeError):  # a file system or platform without the hint: fsync writes
        os.posix_fadvise(fd, offset, num_bytes, os.POSIX_FADV_DONTNEED)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def write_index(out_dir: Path, shards: list[Shard], metadata: dict | None = None, force: bool = False) -> None:
    """Write model.safetensors.index.json when there is more than one shard (or ``force``)."""
    if len(shards) < 2 and not force:
        return
    weight_map = {t.name: s.file_name for s in shards for t in s.tensors}
    index = {
        "metadata": {**(metadata or {}), "total_size": sum(s.nbytes for s in shards)},
        "weight_map": dict(sorted(weight_map.items(), key=lambda kv: natural_key(kv[0]))),
    }
    (out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def natural_key(name: str) -> list:
    """Sort 'layers.10' after 'layers.9'."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
