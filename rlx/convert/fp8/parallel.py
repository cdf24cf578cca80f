"""Run an FP8 conversion's tasks on a pool of threads, reading, quantizing and writing at once.

Each thread runs whole tasks (read rows, quantize, write), so while one waits for the disk the
others compute: ``pread``, ``pwrite`` and torch's kernels all release the GIL. Torch runs one
intra-op thread per task (``torch.set_num_threads(1)`` for the duration), so the pool, not
OpenMP, decides how many cores work. Tasks are queued in file order and at most
``QUEUED_PER_WORKER x workers`` ahead, so reads move through the source sequentially and memory
holds a few tasks per thread. A shard is closed (checked, fsynced) by the thread that finishes
its last task, so its writeback overlaps the next shard's work.

Left out: what a task does (``tasks``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from rlx.convert.fp8.tasks import Task
from rlx.convert.safetensors_writer import ShardFile

QUEUED_PER_WORKER = 2


def default_workers() -> int:
    """One thread per core, plus one, so that a thread waiting on the disk leaves no core idle."""
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) + 1


def run_tasks(groups: Iterable[tuple[ShardFile, list[Task]]], workers: int, on_bytes: Callable[[int], None]) -> None:
    """Run every group's tasks; close each group's file after its last task. Raises the first error."""
    with _torch_threads(1), ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fp8") as pool:
        pending: set[Future] = set()
        try:
            for task in _closing_tasks(groups, on_bytes):
                if len(pending) >= QUEUED_PER_WORKER * workers:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()
                pending.add(pool.submit(task))
            for future in pending:
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _closing_tasks(
    groups: Iterable[tuple[ShardFile, list[Task]]], on_bytes: Callable[[int], None]
) -> Iterator[Callable[[], None]]:
    for out, tasks in groups:
        countdown = _Countdown(out, len(tasks))
        for task in tasks:
            yield functools.partial(_run, task, countdown, on_bytes)


def _run(task: Task, countdown: _Countdown, on_bytes: Callable[[int], None]) -> None:
    on_bytes(task())
    countdown.done()


class _Countdown:
    """Closes a shard's file once the last of its tasks has run (at once when it has none)."""

    def __init__(self, out: ShardFile, num_tasks: int):
        self.out, self.remaining, self.lock = out, num_tasks, threading.Lock()
        if num_tasks == 0:
            out.close()

    def done(self) -> None:
        with self.lock:
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self.out.close()


@contextlib.contextmanager
def _torch_threads(num_threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
