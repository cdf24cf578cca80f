"""What runs on the nodes of a Ray cluster for `rlx train launcher=ray`.

``NodeProcess`` is the body of one Ray actor per process of the run (``rollout0``, ``trainer1``, ...):
it sits in its role's placement-group bundle, reports its node's address and a free port there,
starts the process (`rlx rollout-serve` or a trainer rank) in its own process group, hands its
output to the launcher in batches, and ends the group on request. The process gets the actor's
environment, so the devices Ray granted the bundle (``CUDA_VISIBLE_DEVICES``) are the ones it sees.
A process outlives neither its actor (``PR_SET_PDEATHSIG``) nor the run: ending the group takes
whatever it started (vLLM's engine core), and the shared memory the group mapped is removed.

``python -m rlx.launch.ray_actors CONFIG [overrides]`` is trainer rank 0 of a Ray run: the same
controller as the local launcher's rank 0, except that its peers (the other ranks, the rollout
servers, given in ``rollout.servers``) were started by Ray, not by it.

This module imports no Ray at module level: the actor class is wrapped with ``ray.remote`` by
``rlx.launch.ray_launcher``, and rank 0 never imports Ray.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rlx.launch.leftovers import ShmLeftovers
from rlx.launch.processes import _term_when_parent_dies, python_argv
from rlx.net import free_port

MAX_BUFFERED_LINES = 20_000  # output kept for the launcher between two drains; older lines are dropped


class NodeProcess:
    """One process of the run on the node Ray placed this actor on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"rlx-{name}-"))
        self.leftovers = ShmLeftovers()
        self._lines: collections.deque[str] = collections.deque(maxlen=MAX_BUFFERED_LINES)
        self._pump: threading.Thread | None = None

    def node(self) -> dict:
        """This node's address (as the cluster knows it), a port free on it, the actor's pid and work directory."""
        import ray

        ip = ray.util.get_node_ip_address()
        return {
            "ip": ip,
            "port": free_port(ip),
            "node_id": ray.get_runtime_context().get_node_id(),
            "actor_pid": os.getpid(),
            "workdir": str(self.workdir),
        }

    def start(self, module_args: list[str], env: dict[str, str], files: dict[str, str]) -> int:
        """Write ``files`` into this actor's work directory (``{workdir}`` in an argument names it), start
        ``python -m MODULE_ARGS`` there in a new process group; return its pid (= its group id)."""
        for name, text in files.items():
            (self.workdir / name).write_text(text)
        argv = python_argv(*(arg.replace("{workdir}", str(self.workdir)) for arg in module_args))
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1", **env)
        self.proc = subprocess.Popen(
            argv,
            env=full_env,
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            bufsize=1,
            preexec_fn=_term_when_parent_dies,
        )
        self._pump = threading.Thread(target=self._stream, daemon=True, name=f"log-{self.name}")
        self._pump.start()
        return self.proc.pid

    def _stream(self) -> None:
        for line in self.proc.stdout:
            self._lines.append(line.rstrip("\n"))

    def poll(self) -> tuple[int | None, list[str]]:
        """The exit code (None while it runs) and the lines it printed since the last call."""
        code = self.proc.poll()
        if code is None:
            self.leftovers.record(self.proc.pid)
        elif self._pump is not None:
            self._pump.join(timeout=2)  # the last lines of a process that just exited
        return code, self._drain()

    def _drain(self) -> list[str]:
        lines = []
        while self._lines:
            lines.append(self._lines.popleft())
        return lines

    def stop(self, timeout_s: float = 10.0) -> tuple[int | None, list[str]]:
        """SIGTERM the process group, SIGKILL what is left after ``timeout_s``, remove the shared memory it
        left and the work directory (the run's own logs and config are in its output directory); return its exit
        code and its last lines."""
        if self.proc is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            return None, []
        pgid = self.proc.pid
        if self.proc.poll() is None:
            self.leftovers.record(pgid)
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        _signal_group(pgid, signal.SIGKILL)  # the leader may be gone while its children live on
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self._pump is not None:
            self._pump.join(timeout=2)
        self.leftovers.remove_unused([pgid])
        shutil.rmtree(self.workdir, ignore_errors=True)
        return self.proc.returncode, self._drain()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def rank0_main(argv: list[str]) -> int:
    """Trainer rank 0 of a Ray run: rank 0's controller of the local launcher, with every peer given."""
    from rlx.config import load_config
    from rlx.launch.display import Display
    from rlx.launch.launcher import Launch, supervise
    from rlx.launch.stops import StopWatch

    cfg = load_config(argv[0], argv[1:])
    run_dir = Path(cfg.trainer.output_dir)
    display = Display(cfg.trainer.total_steps, enabled=cfg.logging.console)
    stops = StopWatch()
    with stops.installed():
        display.log_to(run_dir / "logs" / "train.log")
        launch = Launch(cfg, run_dir, display, stops)
        launch._start_ranks = lambda *args: None  # the other ranks are Ray's; RANK etc. come in the environment
        return supervise(launch, display, stops, "stopping")


if __name__ == "__main__":
    sys.exit(rank0_main(sys.argv[1:]))
