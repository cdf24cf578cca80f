"""Shared-memory files that a run's children leave in /dev/shm when they die without cleaning up.

vLLM's processes keep POSIX shared memory there (``psm_*`` segments: the broadcast buffers between
the engine core and its workers, hundreds of MiB); a SIGKILLed server leaves them behind. A name
does not say whose a file is (every vLLM on the machine uses the same names), so ``ShmLeftovers``
records which /dev/shm files each child's process group maps (``/proc/<pid>/maps``) while it runs,
and once that child is dead unlinks the recorded files that no live process maps or holds open.
A file no child of this run was seen mapping is never touched; one created and lost between two
recordings is missed (vLLM creates its buffers at start-up, long before a recording).

A dead child's vLLM engine sockets go too: each server binds them in a directory named by its pid
(``rlx.net.engine_socket_dir``), removed once that child's process group is gone.

Linux only: without /proc nothing is recorded and nothing removed.
"""

from __future__ import annotations

import os
import shutil
import threading

from rlx.net import engine_socket_dir

SHM_DIR = "/dev/shm"
_PREFIX = SHM_DIR + "/"
_DELETED = " (deleted)"


class ShmLeftovers:
    def __init__(self) -> None:
        self.removed: list[str] = []  # every file removed so far
        self._seen: dict[int, set[str]] = {}
        self._lock = threading.Lock()

    def record(self, pgid: int) -> None:
        """Remember the /dev/shm files that the processes of group ``pgid`` map now."""
        files = set().union(*(_mapped_files(pid) for pid in _group_pids(pgid)))
        with self._lock:
            self._seen.setdefault(pgid, set()).update(files)

    def remove_unused(self, pgids: list[int]) -> list[str]:
        """Unlink the files recorded for ``pgids`` that still exist and that no live process uses, and the engine
        socket directory of each group whose processes have all ended."""
        for pgid in pgids:
            if not _group_pids(pgid, running=True):
                shutil.rmtree(engine_socket_dir(pgid), ignore_errors=True)
        with self._lock:
            recorded = set().union(*(self._seen.get(pgid, set()) for pgid in pgids))
        candidates = {path for path in recorded if os.path.exists(path)}
        if not candidates:
            return []
        removed = []
        for path in sorted(candidates - _files_in_use()):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
        with self._lock:
            self.removed.extend(removed)
        return removed


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _group_pids(pgid: int, running: bool = False) -> list[int]:
    """The processes of group ``pgid``; with ``running``, not those that have exited (zombies)."""
    pids = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and not (running and fields[0] == "Z"):
            pids.append(pid)
    return pids


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (a zombie has unmapped its memory already)."""
    return bool(_group_pids(pgid, running=True))


def _mapped_files(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    files = set()
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(_PREFIX) and not parts[5].endswith(_DELETED):
            files.add(parts[5])
    return files


def _open_files(pid: int) -> set[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    files = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(_PREFIX):
            files.add(target)
    return files


def _files_in_use() -> set[str]:
    """/dev/shm files any process this user can inspect maps or holds open."""
    in_use: set[str] = set()
    for pid in _pids():
        in_use |= _mapped_files(pid) | _open_files(pid)
    return in_use
