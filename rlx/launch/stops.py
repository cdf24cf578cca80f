"""Why a run stops before its end, delivered to the launcher's main thread: a child's death
(noticed by the watcher thread), a termination signal (SIGTERM, SIGHUP) or Ctrl-C (SIGINT).

Either becomes one exception in the main thread, so that every early stop leaves through the same
teardown as Ctrl-C: children stopped by process group, buffers unlinked, one line, a non-zero exit.
The exceptions derive from ``BaseException``, as ``KeyboardInterrupt`` does, so that an
``except Exception`` in library code that happens to be running cannot swallow them.

While the run's asyncio task is attached (``guard``), a stop cancels that task and ``guard``
turns the cancellation into the stop's exception: an exception raised from a signal handler could
land inside an event-loop callback that logs and swallows it, leaving the run waiting on a dead
server. The cancellation is repeated every ``cancel_retry_s`` until the task ends, because one
alone can be absorbed: a ``finally`` that awaits the dead server (resuming generation after a
failed sync) would wait out the request deadline, and Python 3.11's ``wait_for`` drops a
cancellation that arrives as its future completes. Outside the event loop (start-up, trainer
construction) the exception is raised between bytecodes, from a signal handler in the main thread
(SIGUSR1 carries a report from the watcher thread there).

Ctrl-C is ``KeyboardInterrupt`` outside the event loop, as Python makes it. While the run's task is
attached it is a stop like SIGTERM (``Interrupted``, exit code 130): asyncio's own SIGINT handling
cancels the task once, and a run waiting on a hung server absorbed that one cancellation and went on
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class RunStopped(BaseException):
    """The run must stop early; ``exit_code`` is what `rlx train` exits with."""

    exit_code = 1


class ChildDied(RunStopped):
    """A rollout server or trainer rank exited while the run needed it."""


class Interrupted(RunStopped):
    """Ctrl-C while the run's asyncio task runs; exits with 130, as ``KeyboardInterrupt`` does."""

    exit_code = 130

    def __init__(self) -> None:
        super().__init__("interrupted")


class Terminated(RunStopped):
    """The launcher received SIGTERM or SIGHUP; exits with 128 + the signal number, as a shell does."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.exit_code = 128 + signum


class StopWatch:
    cancel_retry_s = 1.0

    def __init__(self) -> None:
        self.reasons: list[RunStopped] = []
        self.shielded = False
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopWatch]:
        """Handle SIGUSR1 (a report from the watcher), SIGTERM, SIGHUP and SIGINT; restore the old handlers after."""
        signums = (signal.SIGUSR1, signal.SIGINT, *TERMINATION_SIGNALS)
        previous = {signum: signal.getsignal(signum) for signum in signums}
        signal.signal(signal.SIGUSR1, self._on_report)
        signal.signal(signal.SIGINT, self._on_interrupt)
        for signum in TERMINATION_SIGNALS:
            signal.signal(signum, self._on_termination)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def shield(self) -> Iterator[None]:
        """Teardown: a stop that arrives now is recorded, never raised, so clean-up runs to its end
        (a second Ctrl-C included)."""
        self.shielded = True
        previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def report(self, message: str) -> None:
        """A child died (called from the watcher thread)."""
        if self._record(ChildDied(message)):
            self._deliver()

    def _record(self, reason: RunStopped) -> bool:
        """Keep the first reason; True when this one is it and the run is not already tearing down."""
        with self._lock:
            first = not self.reasons
            self.reasons.append(reason)
        return first and not self.shielded

    def _deliver(self) -> None:
        with self._lock:
            task = self._task
        if task is not None:
            task.get_loop().call_soon_threadsafe(self._cancel_until_done, task)
        else:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    async def guard(self, coro):
        """Await ``coro`` in the current task; a stop meanwhile raises its ``RunStopped``."""
        with self._lock:
            self._task = asyncio.current_task()
            stopped = bool(self.reasons)
        try:
            if stopped:
                coro.close()
                raise self.reasons[0]
            return await coro
        except asyncio.CancelledError:
            if self.reasons:
                raise self.reasons[0] from None
            raise
        finally:
            with self._lock:
                self._task = None

    def _cancel_until_done(self, task: asyncio.Task) -> None:
        if not task.done():
            task.cancel()
            task.get_loop().call_later(self.cancel_retry_s, self._cancel_until_done, task)

    def _on_termination(self, signum, frame) -> None:
        if self._record(Terminated(signum)):
            self._raise_or_cancel()

    def _on_interrupt(self, signum, frame) -> None:
        with self._lock:
            attached = self._task is not None
        if not attached:
            raise KeyboardInterrupt
        if self._record(Interrupted()):
            self._raise_or_cancel()

    def _on_report(self, signum, frame) -> None:
        with self._lock:
            attached = self._task is not None
        if not attached and not self.shielded:  # attached: guard() saw the reason as it attached
            raise self.reasons[0]

    def _raise_or_cancel(self) -> None:
        """In the main thread (a signal handler): cancel the attached task, or raise between bytecodes."""
        with self._lock:
            task = self._task
        if task is None:
            raise self.reasons[0]
        task.get_loop().call_soon_threadsafe(self._cancel_until_done, task)
