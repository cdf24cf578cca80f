"""Keep a streaming conversion's resident memory flat: return freed tensor buffers to the OS.

glibc serves allocations below its mmap threshold from heap arenas and raises that threshold
(up to 32 MiB) each time a large block is freed, so the tensor-sized temporaries of a
conversion, allocated and freed by several threads, end up in arenas that fragment and are not
given back: measured here, an FP8 conversion's peak RSS grew from 0.6 GB to 1.6 GB between a
1 GB and a 3 GB checkpoint. A fixed 4 MiB threshold makes every tensor buffer its own mapping,
unmapped on free, and the peak stays put (0.66 GB for both). Elsewhere than glibc this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 4 << 20


def release_freed_buffers() -> bool:
    """Set glibc's mmap threshold to 4 MiB for this process; True if it took effect."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
