"""Child processes of a run: started in their own process group, logs streamed with a prefix.

Every child is a session leader (``start_new_session``), so ending it means signalling its
process group: the child and anything it spawned (vLLM's engine core and workers) go
together, and nothing is ever found or killed by name. A watcher thread notices a child
that exits while the run still needs it and calls ``on_death`` with a message naming it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, TextIO


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path,
                 emit: Callable[[str], None]) -> None:
        self.name = name
        self.log_path = log_path
        self.expected_exit = False
        self._log: TextIO = open(log_path, "a", buffering=1)
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1,
                                     preexec_fn=_term_when_parent_dies)
        self._pump = threading.Thread(target=self._stream, args=(emit,), daemon=True, name=f"log-{name}")
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _stream(self, emit: Callable[[str], None]) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self._log.write(line + "\n")
            emit(f"[{self.name}] {line}")
        self._log.close()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout_s``."""
        self.expected_exit = True
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.signal_group(signal.SIGKILL)  # the leader may be gone while its children live on
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._pump.join(timeout=2)


class ProcessSet:
    """All children of one run, watched together and torn down together."""

    def __init__(self, log_dir: Path, emit: Callable[[str], None]) -> None:
        self.log_dir = log_dir
        self.emit = emit
        self.children: list[Child] = []
        self._watching = False
        self._watcher: threading.Thread | None = None

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        child = Child(name, argv, full_env, self.log_dir / f"{name}.log", self.emit)
        self.children.append(child)
        self._write_pids()
        return child

    def _write_pids(self) -> None:
        """logs/pids.json: each child's pid (= its process group id), for users and tests."""
        pids = {child.name: child.pid for child in self.children}
        (self.log_dir / "pids.json").write_text(json.dumps(pids, indent=2) + "\n")

    def watch(self, on_death: Callable[[str], None], interval_s: float = 0.5) -> None:
        self._watching = True

        def loop() -> None:
            while self._watching:
                for child in self.children:
                    if not child.expected_exit and not child.alive():
                        self._watching = False
                        on_death(f"{child.name} (pid {child.pid}) exited with code {child.proc.returncode}; "
                                 f"its log is {child.log_path}")
                        return
                time.sleep(interval_s)

        self._watcher = threading.Thread(target=loop, daemon=True, name="child-watcher")
        self._watcher.start()

    def stop_all(self, timeout_s: float = 10.0) -> None:
        self._watching = False
        for child in self.children:
            child.expected_exit = True
        for child in reversed(self.children):
            child.stop(timeout_s)


def _term_when_parent_dies() -> None:
    """Linux: SIGTERM this child if the launcher dies without cleaning up (e.g. SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def python_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]
