"""Where a process's start-up went: when the process started, and the phases it marks on the way to its work.

``process_started_at()`` is the wall-clock time the operating system started this process (Linux's
``/proc/self/stat`` against the boot time in ``/proc/stat``; elsewhere, when this module was first imported),
so that a phase measured from it includes the interpreter and the imports before any rlx code ran.
``mark(name)`` records the wall-clock time of a phase's end in this process; ``marks()`` returns them. The
rollout server reports its marks in its health reply, and the launcher writes the run's start-up from its own
and the servers' (``rlx.launch.startup``).
"""

from __future__ import annotations

import functools
import os
import time

_IMPORTED = time.time()
_MARKS: dict[str, float] = {}


@functools.cache
def process_started_at() -> float:
    """Seconds since the epoch at which this process started."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


def mark(name: str) -> None:
    """Record that phase ``name`` of this process's start-up ended now."""
    _MARKS[name] = time.time()


def marks() -> dict[str, float]:
    """The phases marked so far, by name, and ``started``: the process's start (seconds since the epoch)."""
    return {"started": process_started_at(), **_MARKS}
