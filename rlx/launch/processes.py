"""Child processes of a run: started in their own process group, logs streamed with a prefix.

Every child is a session leader (``start_new_session``), so ending it means signalling its
process group: the child and anything it spawned (vLLM's engine core and workers) go
together, and nothing is ever found or killed by name. A watcher thread notices a child
that exits while the run still needs it and calls ``on_death`` with it and a message naming it;
``on_death`` may ``restart`` it (same name, argv and environment, its log appended, a new process
group) and keep the watch going. The watcher also records the shared memory each child maps, so
that what a dead child leaves in /dev/shm is removed (``rlx.launch.leftovers``).

Python children run with a safe import path (``-P``, and ``PYTHONSAFEPATH=1`` for whatever they
start): a stray ``typer.py`` or ``torch.py`` in the directory `rlx train` was started from is
never imported by them. Modules on ``PYTHONPATH`` or installed stay importable.

A child's log file gets everything it prints; the console gets the same lines except that a
Python traceback is folded into its last line and the path of the log that holds the whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rlx.launch.leftovers import ShmLeftovers


def write_json(path: Path, record: dict) -> None:
    """``record`` as JSON at ``path``, swapped in whole: a reader polling the file never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


class Child:
    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_path: Path | None,
        emit: Callable[[str], None],
        standby: bool = False,
        requested_env: dict[str, str] | None = None,
    ) -> None:
        """``standby``: the process waits for its command line on stdin (``rlx.cli.standby``) and has no log
        yet; ``go`` gives it both. ``requested_env``: what the caller set over the launcher's environment (``env``
        is the whole of it), which decides whether a standby fits the server it is to become: the launcher's own
        environment changes under it as its libraries set their variables (torch's compiler its cache directory),
        which a child started earlier rightly lacks."""
        self.name, self.argv, self.env = name, argv, env
        self.requested_env = dict(requested_env or {})
        self.log_path = log_path
        self.expected_exit = False
        self.restarts = 0  # how many times this child was started again after dying
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            bufsize=1,
            preexec_fn=_term_when_parent_dies,
        )
        self._pump: threading.Thread | None = None
        if log_path is not None:
            self._open_log(log_path, emit)

    def go(self, argv: list[str], args: list[str], log_path: Path, emit: Callable[[str], None]) -> None:
        """A standby child becomes the command ``argv`` (which a restart runs): it is handed ``args``, the
        arguments after ``rlx``, and its output streams into ``log_path`` from here (what it printed while
        waiting included)."""
        self.argv = argv
        self._open_log(log_path, emit)
        with contextlib.suppress(BrokenPipeError, OSError):  # it died meanwhile: the watch reports it
            self.proc.stdin.write(json.dumps(args) + "\n")
            self.proc.stdin.close()

    def _open_log(self, log_path: Path, emit: Callable[[str], None]) -> None:
        self.log_path = log_path
        self._log: TextIO = open(log_path, "a", buffering=1)  # noqa: SIM115 - open until the child's output ends
        self._log.write(f"rlx: starting {self.name}: {' '.join(self.argv)}\n")
        self._pump = threading.Thread(target=self._stream, args=(emit,), daemon=True, name=f"log-{self.name}")
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _stream(self, emit: Callable[[str], None]) -> None:
        console = TracebackFolder(lambda line: emit(f"[{self.name}] {line}"), self.log_path)
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self._log.write(line + "\n")
            console.feed(line)
        console.flush()
        self._log.close()

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout_s``."""
        self.expected_exit = True
        if self.proc.stdin is not None:  # a standby that never went: its wait for a command line ends
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.alive():
            self.signal_group(signal.SIGTERM)
            self.signal_group(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        self.signal_group(signal.SIGKILL)  # the leader may be gone while its children live on
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self._pump is not None:
            self._pump.join(timeout=2)


class TracebackFolder:
    """Passes lines on, except a Python traceback: only its last line goes on, naming the log.

    Chained tracebacks ("During handling of the above exception ...") fold into the last one.
    """

    _CHAINED = ("During handling of the above exception", "The above exception was the direct cause")

    def __init__(self, emit: Callable[[str], None], log_path: Path) -> None:
        self.emit, self.log_path = emit, log_path
        self._in_frames = False
        self._pending: str | None = None  # the exception line, held until a chained traceback is ruled out

    def feed(self, line: str) -> None:
        if line.startswith("Traceback (most recent call last):"):
            self._pending, self._in_frames = None, True
        elif self._in_frames and line[:1] in (" ", "\t", ""):
            pass  # a frame, a source line, a blank line
        elif self._in_frames:
            self._pending, self._in_frames = line, False
        elif self._pending is not None and line.startswith(self._CHAINED):
            self._pending, self._in_frames = None, True
        elif self._pending is not None and not line.strip():
            pass
        else:
            self.flush()
            self.emit(line)

    def flush(self) -> None:
        if self._pending is not None:
            self.emit(f"{self._pending} (traceback in {self.log_path})")
            self._pending = None


class ProcessSet:
    """All children of one run, watched together and torn down together."""

    record_every_s = 2.0

    def __init__(self, log_dir: Path, emit: Callable[[str], None]) -> None:
        self.log_dir = log_dir
        self.emit = emit
        self.children: list[Child] = []
        self.leftovers = ShmLeftovers()
        self._watching = False
        self._watcher: threading.Thread | None = None
        self._lock = threading.Lock()  # a restart and the teardown never interleave

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child = Child(name, argv, child_env(env), self.log_dir / f"{name}.log", self.emit, requested_env=env)
        self.children.append(child)
        self._write_pids()
        return child

    def adopt(self, child: Child, argv: list[str], args: list[str]) -> Child:
        """A standby ``child`` started before this set existed joins it and becomes ``argv`` (``Child.go``)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child.go(argv, args, self.log_dir / f"{child.name}.log", self.emit)
        self.children.append(child)
        self._write_pids()
        return child

    def _write_pids(self) -> None:
        """logs/pids.json: each child's pid (= its process group id), for users and tests."""
        write_json(self.log_dir / "pids.json", {child.name: child.pid for child in self.children})

    def restart(self, child: Child) -> Child | None:
        """Start ``child`` again in its place: same name, argv, environment and log (appended);
        None when the run is being torn down."""
        with self._lock:
            if not self._watching:
                return None
            return self._restart(child)

    def _restart(self, child: Child) -> Child:
        child.stop(timeout_s=0.0)  # whatever of its group is left (vLLM's engine core), and its log pump
        self.leftovers.remove_unused([child.pid])  # what the dead group left and nobody uses
        fresh = Child(child.name, child.argv, child.env, child.log_path, self.emit, requested_env=child.requested_env)
        fresh.restarts = child.restarts + 1
        self.children[self.children.index(child)] = fresh
        self._write_pids()
        return fresh

    def watch(self, on_death: Callable[[Child, str], bool], interval_s: float = 0.5) -> None:
        """Call ``on_death`` when a child exits unexpectedly; the watch goes on while it returns True
        (it restarted the child); meanwhile record the children's shm."""
        self._watching = True
        self._watcher = threading.Thread(
            target=self._watch, args=(on_death, interval_s), daemon=True, name="child-watcher"
        )
        self._watcher.start()

    def _watch(self, on_death: Callable[[Child, str], bool], interval_s: float) -> None:
        recorded_at = 0.0
        while self._watching:
            if time.monotonic() - recorded_at >= self.record_every_s:
                self.record_shm()
                recorded_at = time.monotonic()
            dead = self.dead_children()
            if dead and not on_death(*dead[0]):
                self._watching = False
                self.leftovers.remove_unused([dead[0][0].pid])  # what its group left and nobody uses
                return
            time.sleep(interval_s)

    def dead_children(self, within_s: float = 0.0) -> list[tuple[Child, str]]:
        """Children that exited while the run needed them, each with a message naming it and its log;
        waits up to ``within_s`` for one (a peer sees the sockets of a killed process close before it exits)."""
        deadline = time.monotonic() + within_s
        while True:
            dead = [
                (
                    child,
                    f"{child.name} (pid {child.pid}) exited with code {child.proc.returncode}; "
                    f"its log is {child.log_path}",
                )
                for child in self.children
                if not child.expected_exit and not child.alive()
            ]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def record_shm(self) -> None:
        for child in list(self.children):
            self.leftovers.record(child.pid)

    def _expect_exits(self) -> None:
        """The death watch stops, every child's exit is expected, and what they map in /dev/shm is recorded."""
        with self._lock:
            self._watching = False
        for child in self.children:
            child.expected_exit = True
        self.record_shm()

    def begin_stop(self) -> None:
        """SIGTERM every child's process group without waiting: they end while the launcher finishes its own
        work (the export of the final checkpoint); ``stop_all`` then waits for them and cleans up."""
        self._expect_exits()
        for child in reversed(self.children):
            if child.alive():
                child.signal_group(signal.SIGTERM)
                child.signal_group(signal.SIGCONT)

    def stop_all(self, timeout_s: float = 10.0) -> list[str]:
        """Stop every child's process group; return the /dev/shm files they left, all removed by now."""
        self._expect_exits()
        for child in reversed(self.children):
            child.stop(timeout_s)
        self.leftovers.remove_unused([child.pid for child in self.children])
        return list(self.leftovers.removed)


def child_env(env: dict[str, str] | None) -> dict[str, str]:
    """The launcher's environment with ``env`` over it, unbuffered output and a safe import path."""
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1", **(env or {}))


def _term_when_parent_dies() -> None:
    """Linux: SIGTERM this child if the launcher dies without cleaning up (e.g. SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def python_argv(*args: str) -> list[str]:
    """``python -P -m ARGS``: -P keeps the working directory off the child's import path."""
    return [sys.executable, "-P", "-m", *args]
