"""`rlx train`: check everything, start the rollout servers and trainer ranks, run the
controller as rank 0, and tear every child down on success, error, Ctrl-C or a child's death.

All checks that can fail on user input (config, model path, task data, reward function)
run before any process starts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from pathlib import Path

from omegaconf import OmegaConf

from rlx.launch.display import Display
from rlx.launch.preflight import preflight
from rlx.launch.processes import ProcessSet, python_argv


class ChildDied(RuntimeError):
    """A rollout server or trainer rank exited while the run needed it."""


class DeathWatch:
    """Turns a child's death, reported on the watcher thread, into ``ChildDied`` in the main thread.

    While the run's asyncio task is attached, the report cancels that task and ``guard`` turns the
    cancellation into ``ChildDied``: an exception raised from a signal handler could land inside an
    event-loop callback that logs and swallows it, leaving the run waiting on a dead server. The
    cancellation is repeated every ``cancel_retry_s`` until the task ends, because one alone can be
    absorbed: a ``finally`` that awaits the dead server (resuming generation after a failed sync)
    would wait out the request deadline, and Python 3.11's ``wait_for`` drops a cancellation that
    arrives as its future completes. Outside the event loop (start-up, trainer construction)
    SIGUSR1 raises it between bytecodes.
    """

    cancel_retry_s = 1.0

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._lock = threading.Lock()
        self._task: asyncio.Task | None = None

    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_signal)

    def report(self, message: str) -> None:
        with self._lock:
            self.messages.append(message)
            task = self._task
        if task is not None:
            task.get_loop().call_soon_threadsafe(self._cancel_until_done, task)
        else:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    async def guard(self, coro):
        """Await ``coro`` in the current task; a death meanwhile raises ``ChildDied``."""
        with self._lock:
            self._task = asyncio.current_task()
            dead = bool(self.messages)
        try:
            if dead:
                coro.close()
                raise ChildDied(self.messages[0])
            return await coro
        except asyncio.CancelledError:
            if self.messages:
                raise ChildDied(self.messages[0]) from None
            raise
        finally:
            with self._lock:
                self._task = None

    def _cancel_until_done(self, task: asyncio.Task) -> None:
        if not task.done():
            task.cancel()
            task.get_loop().call_later(self.cancel_retry_s, self._cancel_until_done, task)

    def _on_signal(self, signum, frame) -> None:
        with self._lock:
            attached = self._task is not None
        if not attached:  # a report that raced with guard() attaching: the cancellation handles it
            raise ChildDied(self.messages[0] if self.messages else "a child process died")


# What a run writes into its directory (``trace`` only when trace.dir is not set elsewhere).
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "checkpoints", "logs", "trace", "tb", "hf")


def archive_previous_run(run_dir: Path, display: Display) -> Path | None:
    """Move an earlier run's outputs out of ``run_dir`` into a sibling ``<name>.<time>`` directory.

    A fresh run on top of them would append to their metrics, mix its trace files with theirs, and
    let their higher-numbered checkpoints prune its own; moving them loses nothing. Files rlx did
    not write stay where they are.
    """
    found = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    archive = run_dir.with_name(f"{run_dir.name}.{stamp}")
    suffix = 1
    while archive.exists():
        suffix += 1
        archive = run_dir.with_name(f"{run_dir.name}.{stamp}-{suffix}")
    archive.mkdir()
    for path in found:
        path.rename(archive / path.name)
    display.note(f"{run_dir} held an earlier run: moved its outputs to {archive} "
                 "(pass --resume to continue a run instead)")
    return archive


def run_train(cfg) -> int:
    run_dir = Path(cfg.trainer.output_dir).resolve()
    display = Display(cfg.trainer.total_steps, enabled=cfg.logging.console)
    preflight(cfg, display)
    if not cfg.trainer.resume:
        archive_previous_run(run_dir, display)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "config.yaml"
    config_file.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    procs = ProcessSet(run_dir / "logs", emit=display.log_line)
    env = _trace_env(cfg, run_dir)
    deaths = DeathWatch()
    deaths.install()
    try:
        with display:
            addresses = cfg.rollout.servers or _start_servers(cfg, procs, config_file, env)
            _start_ranks(cfg, procs, config_file, env)
            procs.watch(deaths.report)
            code = _run_rank0(cfg, run_dir, addresses, procs, display, deaths)
        if code == 0 and cfg.checkpoint.export_hf:
            code = _export_hf(run_dir, display)
        return code
    except ChildDied as exc:
        display.note(f"[red]stopping: {exc}[/]")
        return 1
    except KeyboardInterrupt:
        display.note("interrupted: stopping every child process")
        return 130
    finally:
        procs.stop_all()
        _close_distributed()


def _run_rank0(cfg, run_dir: Path, addresses: list[str], procs: ProcessSet, display: Display,
               deaths: DeathWatch) -> int:
    from rlx.engine.trainer import Trainer
    from rlx.launch.controller import Controller
    from rlx.launch.ranks import init_distributed
    from rlx.rollout.client import RolloutClient
    from rlx.trace import tracer

    if cfg.trace.enabled:
        tracer.configure(_trace_dir(cfg, run_dir), role="trainer", name="trainer0")
    init_distributed(_device_type(cfg))
    trainer = Trainer(cfg)

    async def main() -> dict:
        client = RolloutClient(addresses, token=cfg.rollout.auth_token, timeout_s=cfg.rollout.request_timeout_s)
        controller = None
        try:
            alive = lambda: all(c.alive() for c in procs.children)
            await client.wait_ready(cfg.rollout.startup_timeout_s, is_alive=alive)
            display.note(f"rollout servers ready: {', '.join(addresses)}")
            controller = Controller(cfg, run_dir, client, trainer, display)
            last = await controller.run()
            return dict(last, first_eval=controller.first_eval)
        finally:
            if controller is not None:
                controller.close()
            client.close()

    last = asyncio.run(deaths.guard(main()))
    tracer.close()
    display.note(f"done: run directory {run_dir}; held-out accuracy {last.get('first_eval', float('nan')):.3f} "
                 f"-> {last.get('eval_accuracy', float('nan')):.3f}; `rlx plot {run_dir}` draws the curves, "
                 f"`rlx trace-view {run_dir / 'trace'}` shows the timeline")
    return 0


def _export_hf(run_dir: Path, display: Display) -> int:
    """Convert the newest checkpoint to run_dir/hf with `rlx convert-ckpt` (its own process)."""
    import subprocess

    target = run_dir / "hf"
    argv = python_argv("rlx", "convert-ckpt", str(run_dir / "checkpoints"), str(target), "--overwrite")
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        display.note(f"[red]export to Hugging Face failed:[/] {result.stderr.strip() or result.stdout.strip()}")
        return 1
    display.note(f"exported the final checkpoint to {target} (loads in transformers and vLLM)")
    return 0


def _start_servers(cfg, procs: ProcessSet, config_file: Path, env: dict) -> list[str]:
    from rlx.rollout.addresses import server_address

    addresses = []
    for index in range(cfg.rollout.num_servers):
        address = server_address(cfg, index)
        argv = python_argv("rlx", "rollout-serve", str(config_file), "--address", address, "--index", str(index))
        procs.start(f"rollout{index}", argv, dict(env, VLLM_LOGGING_LEVEL="WARNING"))
        addresses.append(address)
    return addresses


def _start_ranks(cfg, procs: ProcessSet, config_file: Path, env: dict) -> None:
    world = cfg.trainer.num_ranks
    if world <= 1:
        return
    port = _free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK="0")
    for rank in range(1, world):
        rank_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank))
        procs.start(f"trainer{rank}", python_argv("rlx.launch.ranks", str(config_file)), rank_env)


def _trace_dir(cfg, run_dir: Path) -> Path:
    return Path(cfg.trace.dir) if cfg.trace.dir else run_dir / "trace"


def _trace_env(cfg, run_dir: Path) -> dict:
    from rlx.trace import ENV_TRACE_DIR

    return {ENV_TRACE_DIR: str(_trace_dir(cfg, run_dir))} if cfg.trace.enabled else {}


def _device_type(cfg) -> str:
    from rlx.engine.model import resolve_device

    return resolve_device(cfg.trainer.device).type


def _close_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
