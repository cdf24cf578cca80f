"""ProcessSet with real child processes: what a killed child leaves in /dev/shm, its import path,
and how its tracebacks reach the console."""

from __future__ import annotations

import mmap
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest

from rlx.launch.processes import ProcessSet, TracebackFolder, python_argv

SHM = Path("/dev/shm")

# Creates and maps its own segment, maps one the test created, then waits to be killed.
MAPPER = """
import mmap, os, sys, time
own, shared, ready = sys.argv[1:4]
fd = os.open(own, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, 1 << 20)
own_map = mmap.mmap(fd, 1 << 20)
fd2 = os.open(shared, os.O_RDWR)
shared_map = mmap.mmap(fd2, 1 << 20)
open(ready, "w").close()
time.sleep(600)
"""


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def shm_files():
    paths = [SHM / f"rlx-test-{name}-{secrets.token_hex(4)}" for name in ("own", "shared", "unrelated")]
    yield paths
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.mark.skipif(not SHM.is_dir() or not Path("/proc/self/maps").exists(), reason="needs Linux /dev/shm")
def test_a_killed_child_loses_only_the_shared_memory_nobody_else_uses(shm_files, tmp_path):
    own, shared, unrelated = shm_files
    for path in (shared, unrelated):
        path.write_bytes(bytes(1 << 20))
    with open(shared, "r+b") as f:
        still_mapped_here = mmap.mmap(f.fileno(), 1 << 20)
    ready = tmp_path / "ready"
    procs = ProcessSet(tmp_path / "logs", emit=lambda line: None)
    procs.record_every_s = 0.1
    child = procs.start("mapper", [sys.executable, "-c", MAPPER, str(own), str(shared), str(ready)])
    deaths = []
    try:
        wait_for(ready.exists)
        procs.watch(lambda child, message: deaths.append(message), interval_s=0.05)
        time.sleep(0.5)  # a few recordings
        os.killpg(child.pid, signal.SIGKILL)  # no clean-up of its own
        wait_for(lambda: deaths)
        wait_for(lambda: not own.exists(), timeout_s=10)  # removed by the watcher, right after the death
    finally:
        procs.stop_all()
    assert "mapper" in deaths[0]
    assert shared.exists(), "a file another live process maps was removed"
    assert unrelated.exists(), "a file no child mapped was removed"
    still_mapped_here.close()


def test_python_children_do_not_import_from_the_working_directory(tmp_path):
    """A stray json.py (or typer.py, torch.py) where the launcher runs is never imported by its children."""
    marker = tmp_path / "imported"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    procs = ProcessSet(tmp_path / "logs", emit=lambda line: None)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        child = procs.start("child", python_argv("json.tool", "--help"))
        child.proc.wait(60)
        grandchild = procs.start(
            "grandchild",
            [
                sys.executable,
                "-c",
                "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import json'], check=True)",
            ],
        )
        grandchild.proc.wait(60)
    finally:
        os.chdir(cwd)
        procs.stop_all()
    assert child.proc.returncode == 0 and grandchild.proc.returncode == 0
    assert not marker.exists()


def test_a_child_traceback_reaches_the_console_as_its_last_line_and_the_log_path(tmp_path):
    lines: list[str] = []
    log = tmp_path / "trainer1.log"
    folder = TracebackFolder(lines.append, log)
    output = [
        "starting",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "    f()",
        "    ^^^",
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "a.py", line 3',
        "RuntimeError: gloo connection closed",
        "after",
    ]
    for line in output:
        folder.feed(line)
    folder.feed("Traceback (most recent call last):")
    folder.feed('  File "b.py", line 9')
    folder.feed("ValueError: last words")
    folder.flush()  # the child's output ended
    assert lines == [
        "starting",
        f"RuntimeError: gloo connection closed (traceback in {log})",
        "after",
        f"ValueError: last words (traceback in {log})",
    ]
