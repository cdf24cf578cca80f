"""Bucket layout: where each tensor's bytes go in a slot of the shared buffer.

Tensors are packed in arrival order at offsets aligned to ``ALIGN_BYTES`` (so a receiver can view
any dtype in place and GPU copies stay vectorised). A tensor that does not fit in what is left of
a slot starts the next bucket; a tensor larger than a whole slot is split into slot-sized chunks,
each its own bucket, its last chunk shared with the tensors that follow. Only split tensors need
an assembled copy on the receiver; everything else is a zero-copy view.

The packer is a generator over tensor specs, so a sender can stream parameters (FSDP2
``full_tensor()`` one at a time) and hold at most one bucket plus one tensor. This module is pure
Python and leaves out where the slots live (``transports``) and the copies (``sender``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from rlx.sync.messages import TensorChunk

ALIGN_BYTES = 256


class TensorSpec(NamedTuple):
    name: str
    dtype: str
    shape: list[int]
    nbytes: int


class Bucket(NamedTuple):
    chunks: list[TensorChunk]
    is_last: bool


def align_up(nbytes: int, align: int = ALIGN_BYTES) -> int:
    return (nbytes + align - 1) // align * align


def pack_buckets(specs: Iterable[TensorSpec], slot_bytes: int) -> Iterator[Bucket]:
    """Yield the buckets for ``specs`` in order; every yielded bucket fits in ``slot_bytes``."""
    if slot_bytes <= 0 or slot_bytes % ALIGN_BYTES:
        raise ValueError(f"slot_bytes={slot_bytes} must be a positive multiple of {ALIGN_BYTES}")
    chunks: list[TensorChunk] = []
    used = 0
    for spec in specs:
        if spec.nbytes > slot_bytes:
            if chunks:
                yield Bucket(chunks, is_last=False)
            *full, tail = _split(spec, slot_bytes)
            for chunk in full:
                yield Bucket([chunk], is_last=False)
            chunks, used = [tail], align_up(tail.nbytes)
            continue
        if used + spec.nbytes > slot_bytes:
            yield Bucket(chunks, is_last=False)
            chunks, used = [], 0
        chunks.append(TensorChunk(spec.name, spec.dtype, list(spec.shape), used, spec.nbytes, 0, spec.nbytes))
        used = align_up(used + spec.nbytes)
    if chunks:
        yield Bucket(chunks, is_last=True)


def _split(spec: TensorSpec, slot_bytes: int) -> list[TensorChunk]:
    return [
        TensorChunk(
            spec.name, spec.dtype, list(spec.shape), 0, min(slot_bytes, spec.nbytes - start), start, spec.nbytes
        )
        for start in range(0, spec.nbytes, slot_bytes)
    ]


def resident_buckets(placed: Iterable[tuple[TensorSpec, int]], bucket_bytes: int) -> Iterator[Bucket]:
    """Buckets for tensors that already sit in the shared buffer at the given byte offsets (an
    ``rlx.sync.arena``): consecutive tensors grouped up to ``bucket_bytes``, never split (nothing is
    copied, so a bucket only sets how much a receiver loads between two acks)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    chunks: list[TensorChunk] = []
    used = 0
    for spec, offset in placed:
        if chunks and used + spec.nbytes > bucket_bytes:
            yield Bucket(chunks, is_last=False)
            chunks, used = [], 0
        chunks.append(TensorChunk(spec.name, spec.dtype, list(spec.shape), offset, spec.nbytes, 0, spec.nbytes))
        used += spec.nbytes
    if chunks:
        yield Bucket(chunks, is_last=True)
