"""The process-wide tracer: spans and instant events written as JSON lines, off by default.

    from rlx.trace import tracer
    tracer.configure("runs/x/trace", role="rollout", name="rollout0")   # or configure_from_env
    with tracer.span("generate", request_id=rid, prompt_tokens=n) as span:
        ...
        span.set(completion_tokens=k, finish_reason="stop")
    tracer.event("request_queued", request_id=rid)

Guarantees, in order of importance:

- Tracing never breaks the traced code. An exception inside a span is recorded and re-raised
  unchanged; an error of the tracer itself (disk full, an attribute JSON cannot hold) disables
  or degrades tracing with one warning on stderr, never an exception in the caller.
- Off costs a function call: ``span()`` returns a shared no-op object, ``event()`` returns.
- Nesting follows ``contextvars``, so the parent of a span is right in threads and across
  ``await`` (each asyncio task sees the span it was created under).
- A span is one line, written when it ends (a complete record: start, duration, attributes).
  A span still open after ``open_span_flush_s`` (1 s) also gets a begin line, written by a
  small daemon thread, and then ends with an end line: a hang or a crash leaves every
  long-running span in the file, drawn as unfinished. A crash loses only spans younger than
  that. One line per short span halves the writes and the reading time of a busy trace.
- Every line goes to the operating system as one ``write`` when it happens (the file is opened
  unbuffered, ``O_APPEND``): a crash, even SIGKILL, loses nothing already written, and threads
  never interleave partial lines. ``flush()`` writes the begin lines of all open spans now;
  ``os.fsync`` is deliberately never called (power loss is out of scope).

A forked child traces into its own file (named with its pid, created at its first record, so a
helper that traces nothing leaves none); spans the parent opened are not ended in it.

Left out: sampling, remote collectors and log rotation.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import inspect
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlx.trace.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    NO_ATTRS,
    REQUEST_KEY,
    Begin,
    Complete,
    End,
    Header,
    Instant,
    encoder,
)

ENV_TRACE_DIR = "RLX_TRACE_DIR"
OPEN_SPAN_FLUSH_S = 1.0
_FILE_AFTER_FORK = -1  # the tracer's fd in a forked child until its first record opens a file
_MAX_ERROR_CHARS = 500


class _NoopSpan:
    """What ``span()`` returns when tracing is off: every method does nothing."""

    __slots__ = ()
    id = 0

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    async def __aenter__(self) -> _NoopSpan:
        return self

    async def __aexit__(self, *exc: object) -> bool:
        return False

    def set(self, **attrs: Any) -> None:
        pass


NOOP_SPAN = _NoopSpan()


class Span:
    """A live span. Written once at exit as a complete record, unless it stayed open long enough
    for the tracer's watcher to write its begin line (then the exit writes an end line)."""

    __slots__ = ("_tracer", "_generation", "name", "attrs", "id", "parent", "start", "begun", "_token", "_extra")

    def __init__(self, tracer: Tracer, name: str, attrs: dict) -> None:
        self._tracer = tracer
        self._generation = tracer._generation
        self.name = name
        self.attrs = attrs
        self.id = 0
        self.parent = 0
        self.start = 0
        self.begun = False
        self._token: contextvars.Token | None = None
        self._extra: dict | None = None

    def set(self, **attrs: Any) -> None:
        """Add attributes; they are written with the span's end."""
        if self._extra is None:
            self._extra = attrs
        else:
            self._extra.update(attrs)

    def __enter__(self) -> Span:
        tracer = self._tracer
        self.id = next(tracer._ids)
        self.parent = tracer._current.get()
        self._token = tracer._current.set(self.id)
        self.start = time.monotonic_ns() - tracer._mono0
        tracer._open_spans[self.id] = self
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> bool:
        self._restore_parent()
        tracer = self._tracer
        tracer._open_spans.pop(self.id, None)
        if self._generation == tracer._generation:
            tracer._write_end(self, _describe(exc_type, exc))
        return False

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> bool:
        return self.__exit__(exc_type, exc, tb)

    def _restore_parent(self) -> None:
        try:
            self._tracer._current.reset(self._token)
        except ValueError:  # exited in another context (e.g. a generator resumed elsewhere)
            self._tracer._current.set(self.parent)


def _describe(exc_type: type | None, exc: BaseException | None) -> str | None:
    if exc_type is None:
        return None
    text = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
    return text[:_MAX_ERROR_CHARS]


class Tracer:
    """Writes this process's spans and events to ``<trace_dir>/<name>.<pid>.jsonl`` once configured."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._ids = itertools.count(1)
        # The enclosing span's id; one variable per tracer so that two tracers never mix ids.
        self._current: contextvars.ContextVar[int] = contextvars.ContextVar(f"rlx_span_{id(self)}", default=0)
        self._open_spans: dict[int, Span] = {}
        self._watcher: threading.Event | None = None
        self._generation = 0
        self._mono0 = 0
        self._dir: Path | None = None
        self._role = ""
        self._name = ""
        self.open_span_flush_s = OPEN_SPAN_FLUSH_S
        self.path: Path | None = None

    # -- switching on and off -------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    @property
    def name(self) -> str:
        """This process's name in the trace (``configure``'s ``name``), or "" when it was never configured."""
        return self._name

    def configure(
        self, trace_dir: str | Path, role: str, name: str, *, open_span_flush_s: float = OPEN_SPAN_FLUSH_S
    ) -> Path:
        """Start writing this process's trace into ``trace_dir``; returns the file path.

        ``open_span_flush_s``: a span still open after this many seconds gets its begin line
        written, so that a crash or hang leaves it in the file."""
        _check_name("role", role)
        _check_name("name", name)
        if open_span_flush_s <= 0:
            raise ValueError(f"open_span_flush_s={open_span_flush_s} must be > 0 (seconds)")
        self.close()
        self._dir, self._role, self._name = Path(trace_dir), role, name
        self.open_span_flush_s = open_span_flush_s
        self._start_file()
        return self.path

    def configure_from_env(self, role: str, name: str) -> bool:
        """Enable tracing iff ``RLX_TRACE_DIR`` is set (how child processes inherit it)."""
        trace_dir = os.environ.get(ENV_TRACE_DIR, "")
        if not trace_dir:
            return False
        self.configure(trace_dir, role, name)
        return True

    def flush(self, min_age_s: float = 0.0) -> None:
        """Write the begin line of every span open for at least ``min_age_s`` (all by default),
        so that the file describes everything open now. Finished spans are always written."""
        if self._fd is None:
            return
        oldest = self._now() - int(min_age_s * 1e9)
        for span in list(self._open_spans.values()):
            if not span.begun and span.start <= oldest and span._generation == self._generation:
                span.begun = True
                self._write_begin(span)

    def close(self) -> None:
        """Stop tracing; spans still open are written as begun and stay unfinished in the file."""
        self.flush()
        if self._watcher is not None:
            self._watcher.set()
            self._watcher = None
        fd, self._fd = self._fd, None
        self._generation += 1
        self._open_spans.clear()
        if fd is not None and fd != _FILE_AFTER_FORK:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- recording ------------------------------------------------------------------------

    def span(self, name: str, /, **attrs: Any) -> Span | _NoopSpan:
        """A context manager (sync or async) timing its body; ``as s`` gives ``s.set(...)``."""
        if self._fd is None:
            return NOOP_SPAN
        return Span(self, name, attrs)

    def event(self, name: str, /, **attrs: Any) -> None:
        """An instant event, attached to the enclosing span."""
        if self._fd is None:
            return
        rid = attrs.pop(REQUEST_KEY, None)
        self._write(Instant(n=name, t=self._now(), p=self._current.get(), r=rid, a=attrs or NO_ATTRS))

    def traced(self, name: str | Callable | None = None, /, **attrs: Any) -> Callable:
        """Decorator: run each call of a sync or async function inside a span."""
        if callable(name):
            return self.traced(None)(name)

        def decorate(fn: Callable) -> Callable:
            return _wrap(self, fn, name or fn.__qualname__, attrs)

        return decorate

    # -- internals ------------------------------------------------------------------------

    def _now(self) -> int:
        return time.monotonic_ns() - self._mono0

    def _write_begin(self, span: Span) -> None:
        attrs = dict(span.attrs)
        rid = attrs.pop(REQUEST_KEY, None)
        self._write(Begin(i=span.id, n=span.name, t=span.start, p=span.parent, r=rid, a=attrs or NO_ATTRS))

    def _write_end(self, span: Span, err: str | None) -> None:
        now = time.monotonic_ns() - self._mono0
        if span.begun:
            extra = span._extra or {}
            self._write(End(i=span.id, t=now, r=extra.pop(REQUEST_KEY, None), a=extra or NO_ATTRS, err=err))
            return
        attrs = span.attrs if span._extra is None else {**span.attrs, **span._extra}
        rid = attrs.pop(REQUEST_KEY, None)  # the span is over: its attrs dict is ours to change
        self._write(
            Complete(
                i=span.id,
                n=span.name,
                t=span.start,
                d=now - span.start,
                p=span.parent,
                r=rid,
                a=attrs or NO_ATTRS,
                err=err,
            )
        )

    def _write(self, record: object) -> None:
        fd = self._fd
        if fd is None or (fd == _FILE_AFTER_FORK and not self._start_file_after_fork()):
            return
        fd = self._fd
        try:
            data = encoder.encode(record)
        except Exception as exc:  # noqa: BLE001 - a bad attribute must never reach the caller
            data = encoder.encode(_without_attrs(record, exc))
        try:
            os.write(fd, data + b"\n")
        except OSError as exc:
            _warn(f"tracing to {self.path} stopped: {exc}; the traced program goes on without it")
            self._fd = None
            self.close()

    def _start_file(self) -> None:
        pid = os.getpid()
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            self.path = self._dir / f"{self._name}.{pid}.jsonl"
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise ValueError(
                f"cannot write the trace into {self._dir}: {exc}; set trace.dir "
                f"(or {ENV_TRACE_DIR}) to a writable directory"
            ) from None
        self._mono0 = time.monotonic_ns()
        header = Header(
            format=FORMAT_NAME,
            version=FORMAT_VERSION,
            name=self._name,
            role=self._role,
            pid=pid,
            host=socket.gethostname(),
            wall_ns=time.time_ns(),
            mono_ns=self._mono0,
        )
        self._fd = fd
        self._generation += 1
        self._write(header)
        self._watcher = _watch_open_spans(self)

    def _after_fork_in_child(self) -> None:
        """The parent's file, watcher thread and open spans are the parent's. The child gets its
        own file at its first record, so a forked helper that traces nothing leaves no file."""
        if self._fd is None:
            return
        if self._fd != _FILE_AFTER_FORK:
            os.close(self._fd)
        self._fd, self._watcher = _FILE_AFTER_FORK, None
        self._generation += 1
        self._open_spans.clear()

    def _start_file_after_fork(self) -> bool:
        self._fd, generation = None, self._generation
        try:
            self._start_file()
        except ValueError as exc:
            _warn(f"tracing stopped in forked child {os.getpid()}: {exc}")
            return False
        self._generation = generation  # spans the child opened before its first record still count
        return True


def _watch_open_spans(tracer: Tracer) -> threading.Event:
    """A daemon thread writing begin lines of spans open longer than ``open_span_flush_s``."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(tracer.open_span_flush_s / 2):
            try:
                tracer.flush(min_age_s=tracer.open_span_flush_s)
            except Exception as exc:  # noqa: BLE001 - never let the watcher die loudly mid-run
                _warn(f"open-span watcher stopped: {exc}")
                return

    threading.Thread(target=run, name="rlx-trace-open-spans", daemon=True).start()
    return stop


def _wrap(tracer: Tracer, fn: Callable, name: str, attrs: dict) -> Callable:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if tracer._fd is None:
                return await fn(*args, **kwargs)
            with tracer.span(name, **attrs):
                return await fn(*args, **kwargs)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if tracer._fd is None:
            return fn(*args, **kwargs)
        with tracer.span(name, **attrs):
            return fn(*args, **kwargs)

    return wrapper


def _without_attrs(record: Any, exc: Exception) -> Any:
    """The record with its attributes replaced by the reason they could not be written."""
    record.a = {"trace_error": f"attributes not JSON-serialisable: {exc}"[:_MAX_ERROR_CHARS]}
    return record


def _check_name(what: str, value: str) -> None:
    if not value or "/" in value or "\\" in value or value.startswith("."):
        raise ValueError(
            f"trace {what}={value!r} must be a non-empty file-name part without '/' or a leading '.', e.g. 'trainer0'"
        )


def _warn(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"rlx trace: {message}", file=sys.stderr, flush=True)


tracer = Tracer()
os.register_at_fork(after_in_child=tracer._after_fork_in_child)
atexit.register(tracer.close)
