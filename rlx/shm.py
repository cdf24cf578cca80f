"""/dev/shm segments: files in POSIX shared memory that several processes of one host map.

The weight sync's shm transport (``rlx.sync.transports.shm``) and the sample store's host transport
(``rlx.store.shm``) both keep their bytes in one: ``create`` makes a segment (mode 0600, its space
reserved up front with ``posix_fallocate``, so a full /dev/shm is an error here, not a SIGBUS later),
``open_segment`` maps an existing one, ``tensor_over`` is a byte tensor over a mapping built through
numpy (so ``close_mapping`` refuses, naming the segment, while any view is alive), ``unlink`` removes a
name, and ``remove_dead_owners`` the segments whose owner process (the pid in the name) is gone.
Left out: naming, handles and what the bytes mean (each user's own).
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import re

import numpy as np
import torch

SHM_DIR = "/dev/shm"


def remove_dead_owners(pattern: str, name: re.Pattern) -> list[str]:
    """Unlink the /dev/shm segments matching ``pattern`` whose whole name matches ``name``
    (``PREFIX-PID-HEX``) and whose owner pid no longer exists; returns their paths."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, pattern)):
        if not name.fullmatch(os.path.basename(path)):
            continue
        try:
            os.kill(int(os.path.basename(path).split("-")[2]), 0)
        except ProcessLookupError:
            unlink(path)
            removed.append(path)
        except PermissionError:  # alive, another user's
            pass
    return removed


def create(path: str, size: int) -> mmap.mmap:
    if not os.path.isdir(SHM_DIR):
        raise RuntimeError(
            f"the shm weight transport needs POSIX shared memory at {SHM_DIR}; use transport=cuda_ipc on a GPU host"
        )
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        return _map(fd, size)
    except OSError as exc:
        unlink(path)
        free = os.statvfs(SHM_DIR).f_bavail * os.statvfs(SHM_DIR).f_frsize
        raise RuntimeError(
            f"cannot reserve {size / 2**20:.0f} MiB in {SHM_DIR} ({free / 2**20:.0f} MiB free): {exc}; "
            "lower sync.bucket_mb or sync.num_buffers, or give the container more shared "
            "memory (docker run --shm-size=...)"
        ) from None
    finally:
        os.close(fd)


def open_segment(path: str, size: int) -> mmap.mmap:
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shared-memory segment {path} does not exist: the sender closed it, or the "
            "receiver runs in another container / IPC namespace than the sender"
        ) from None
    try:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise ValueError(f"shared-memory segment {path} holds {actual} bytes, the handle says {size}")
        return _map(fd, size)
    finally:
        os.close(fd)


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def tensor_over(mm: mmap.mmap) -> torch.Tensor:
    """A uint8 tensor over the whole mapping."""
    # numpy holds a buffer export, so mm.close() refuses while any tensor view is alive
    return torch.from_numpy(np.frombuffer(mm, dtype=np.uint8))


def close_mapping(mm: mmap.mmap, path: str) -> None:
    try:
        mm.close()
    except BufferError:
        raise views_still_held(path) from None


def views_still_held(path: str) -> BufferError:
    return BufferError(
        f"tensors over the shared buffer {path} are still referenced; a receiver must drop "
        "the views from WeightReceiver.tensors() before acknowledging their bucket"
    )


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
