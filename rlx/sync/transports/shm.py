"""POSIX shared memory transport (CPU): one file in /dev/shm, mapped by sender and receivers.

The sender creates ``/dev/shm/rlx-sync-<pid>-<random>`` (mode 0600, space reserved up front with
``posix_fallocate`` so a full /dev/shm is an error here, not a SIGBUS later), maps it and unlinks
it on ``close`` or, failing that, at interpreter exit. A sender killed by a signal it does not
handle leaves the file behind: whoever started it calls ``remove_segments_of(pid)`` once it has
reaped it, and ``rlx train`` removes the segments of dead senders (``remove_stale_segments``)
before it starts. Receivers map the file by name; a name that is not an rlx segment is
refused, so a message cannot make a receiver open another file.

Tensors over a mapping are built through numpy so that the mapping cannot be closed while any of
them is alive (``close`` raises ``BufferError`` instead of unmapping memory still in use).

A *resident* buffer (``rlx.sync.arena``: the trainer's weights themselves) is one slot that the
receivers keep mapped between syncs, because mapping a gigabyte costs more than copying it: at the
end of a sync they only drop their tensors (``release_views``), which fails the same way when the
consumer still holds one.
The ordering of writes and reads is given by the acknowledgements (socket round trips), so
``ready`` and ``done_reading`` have nothing to do here.
"""

from __future__ import annotations

import glob
import os
import re
import secrets
import weakref

import numpy as np
import torch

from rlx.shm import (
    SHM_DIR,
    close_mapping,
    create,
    open_segment,
    remove_dead_owners,
    tensor_over,
    unlink,
    views_still_held,
)
from rlx.sync.messages import TransportHandle
from rlx.sync.transports.base import ReceiverMapping, SenderBuffer

_NAME = re.compile(r"rlx-sync-[0-9]+-[0-9a-f]+")  # used with fullmatch: no separators, no newline


class ShmBuffer(SenderBuffer):
    def __init__(self, slot_bytes: int, num_slots: int, resident: bool = False):
        self.slot_bytes, self.num_slots, self.resident = slot_bytes, num_slots, resident
        self.size = slot_bytes * num_slots
        self.name = f"rlx-sync-{os.getpid()}-{secrets.token_hex(6)}"
        self.path = os.path.join(SHM_DIR, self.name)
        self._mm = create(self.path, self.size)
        self._finalizer = weakref.finalize(self, unlink, self.path)
        self._tensor = tensor_over(self._mm)

    def slot(self, index: int) -> torch.Tensor:
        return self._tensor[index * self.slot_bytes : (index + 1) * self.slot_bytes]

    def ready(self, index: int) -> None:
        pass

    def handle(self) -> TransportHandle:
        payload = {"name": self.name, "size": self.size}
        if self.resident:
            payload["resident"] = True
        return TransportHandle("shm", self.slot_bytes, self.num_slots, payload)

    def unlink(self) -> None:
        """Remove the segment's name; existing mappings, and tensors over them, stay valid."""
        self._finalizer()

    def close(self) -> None:
        self.unlink()  # the name first: existing mappings stay valid
        self._tensor = None
        if self._mm is not None:
            close_mapping(self._mm, self.path)
            self._mm = None


class ShmMapping(ReceiverMapping):
    def __init__(self, handle: TransportHandle):
        self.handle = handle
        name, size = handle.payload.get("name"), handle.payload.get("size")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"shm handle names {name!r}, which is not an rlx sync segment (rlx-sync-<pid>-<hex>, "
                "no path separators)"
            )
        if handle.slot_bytes < 1 or handle.num_slots < 1 or size != handle.slot_bytes * handle.num_slots:
            raise ValueError(f"shm handle size {size} != slot_bytes {handle.slot_bytes} x num_slots {handle.num_slots}")
        self.path = os.path.join(SHM_DIR, name)
        self.keep_mapped = handle.payload.get("resident") is True
        self._mm = open_segment(self.path, size)
        self._tensor: torch.Tensor | None = None
        self._array: weakref.ref | None = None

    def slot(self, index: int) -> torch.Tensor:
        if self._tensor is None:
            array = np.frombuffer(self._mm, dtype=np.uint8)  # a fresh one per sync: release_views watches it
            self._array = weakref.ref(array)
            self._tensor = torch.from_numpy(array)
        return self._tensor[index * self.handle.slot_bytes : (index + 1) * self.handle.slot_bytes]

    def done_reading(self, index: int) -> None:
        pass

    def release_views(self) -> None:
        self._tensor = None
        if self._array is not None and self._array() is not None:
            raise views_still_held(self.path)

    def close(self) -> None:
        self._tensor = None
        if self._mm is not None:
            close_mapping(self._mm, self.path)
            self._mm = None


def remove_segments_of(pid: int) -> list[str]:
    """Unlink the segments sender process ``pid`` left behind; call it only after that process has
    exited (mappings other processes still hold stay valid). Returns the removed paths."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, f"rlx-sync-{int(pid)}-*")):
        unlink(path)
        removed.append(path)
    return removed


def remove_stale_segments() -> list[str]:
    """Unlink the segments of sender processes that no longer exist (a SIGKILLed ``rlx train``
    leaves its buffer behind); a segment whose pid is alive, or cannot be checked, stays."""
    return remove_dead_owners("rlx-sync-*", _NAME)
