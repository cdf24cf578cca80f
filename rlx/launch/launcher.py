"""`rlx train`: check everything, start the rollout servers and trainer ranks, run the
controller as rank 0, and tear every child down on success, error, Ctrl-C, SIGTERM / SIGHUP or a
child's death.

All checks that can fail on user input (config, model path, task data, reward function)
run before any process starts; they fail as one line and exit 2. After that every failure is one
console line naming what failed and the launcher's log (``RUN_DIR/logs/train.log``), which holds
the traceback; the exit code is non-zero and the teardown is always the same: children stopped by
process group, the shared memory they left removed, the weight-sync buffers unlinked, the run's
socket files removed.

A launched rollout server that dies mid-run is restarted when rollout.restart_on_failure is on
(``rlx.launch.restarts``); the run goes on.

Start-up overlaps: a standby process per launched server (``rlx.cli.standby``) starts before the
pre-flight, with the server's environment, and imports its engine (vLLM: 10-25 s) while the checks run;
it opens nothing until the launch hands it its command line, and a run that ends in pre-flight stops it.
The servers then load their engines while rank 0 builds the trainer and the controller (model, optimizer,
task, weight arena) and warms up its kernels; only then does it wait for the servers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from rlx.config.roles import rollout_role, trainer_role, write_role
from rlx.launch.closing import already_done, done_line, resume_hint, where_things_go
from rlx.launch.display import Display
from rlx.launch.preflight import preflight
from rlx.launch.processes import ProcessSet, child_env, python_argv
from rlx.launch.restarts import ServerRestarts
from rlx.launch.run_dir import (
    SECRET_ENV,
    archive_previous_run,
    remove_sockets,
    secret_overrides,
    write_config,
)
from rlx.launch.startup import write_startup
from rlx.launch.stops import ChildDied, Interrupted, RunStopped, StopWatch
from rlx.net import free_port
from rlx.placement import plan, visible_gpus
from rlx.rollout.priority import ENV_NO_SPIN, ENV_SCHED_IDLE
from rlx.trace import startup

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


def run_train(cfg: RunConfig) -> int:
    """The whole run on this host (``launcher=embedded``; ``rlx.launch.ray_launcher.run_ray_train`` is Ray's);
    returns the exit code. User errors found before any process starts propagate."""
    quiet_progress_bars()
    run_dir = Path(cfg.trainer.output_dir).resolve()
    cfg.rollout.auth_token = cfg.rollout.auth_token or os.environ.get(SECRET_ENV["rollout.auth_token"], "")
    display = Display(cfg.trainer.total_steps, enabled=cfg.logging.console)
    stops = StopWatch()
    with stops.installed():
        standbys = start_standbys(cfg, run_dir)  # the servers import their engines while the pre-flight runs
        launch = None
        try:
            stopped = prepare(cfg, run_dir, display, "train.log")
            if stopped is not None:
                return stopped
            launch = Launch(cfg, run_dir, display, stops, standbys)
        finally:
            if launch is None:  # a pre-flight error, a stop, nothing to do: the standbys go unused
                for child in standbys.values():
                    child.stop(timeout_s=2.0)

        def failed() -> str:
            dead = launch.procs.dead_children(within_s=2.0)  # a death often surfaces first as a peer's error
            return f"the run failed ({dead[0][1]})" if dead else "the run failed"

        return supervise(
            launch, display, stops, lambda: f"stopping every child process; {resume_hint(run_dir)}", failed
        )


def prepare(cfg: RunConfig, run_dir: Path, display: Display, log_name: str) -> int | None:
    """Before anything starts (under ``stops.installed()``): pre-flight, the previous run moved aside, the
    console logged to ``RUN_DIR/logs/log_name``. The exit code if the run ends here (a stop came meanwhile, or
    ``--resume`` of a run already at trainer.total_steps), else None."""
    try:
        resumed_step = preflight(cfg, display)
        if resumed_step is not None and resumed_step >= cfg.trainer.total_steps:
            display.note(already_done(run_dir, resumed_step, cfg.trainer.total_steps))
            return 0
        if not cfg.trainer.resume:
            archive_previous_run(run_dir, display)
        display.log_to(run_dir / "logs" / log_name)
        display.note(where_things_go(cfg, run_dir, log_name))
    except (KeyboardInterrupt, RunStopped) as exc:
        return _stopped(display, exc, "nothing was started")
    return None


def supervise(
    run,
    display: Display,
    stops: StopWatch,
    stopping,
    failed=lambda: "the run failed",
    passthrough: tuple[type[BaseException], ...] = (),
) -> int:
    """``run.run()``'s exit code, however it ends: a stop or Ctrl-C says ``stopping`` (a string, or a callable
    that makes it then); an error is one console line (``failed()``; the traceback in the log) and exit 1, except
    ``passthrough`` errors, which propagate; ``run.tear_down()`` always runs, shielded from a second stop."""
    said = lambda: stopping() if callable(stopping) else stopping  # noqa: E731
    try:
        return run.run()
    except (KeyboardInterrupt, RunStopped) as exc:
        return _stopped(display, exc, said())
    except passthrough:
        raise
    except Exception as exc:  # noqa: BLE001 - one line on the console, the traceback in the log
        display.failure(failed(), exc, then=said())
        return 1
    finally:
        with stops.shield():
            run.tear_down()


def _stopped(display: Display, exc: BaseException, what_next: str) -> int:
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        display.note(f"interrupted: {what_next}")
        return 130
    if isinstance(exc, ChildDied):
        display.note(f"[red]stopping: {escape(str(exc))}[/]")
    else:
        display.note(f"{exc}: {what_next}")
    return exc.exit_code


class Launch:
    """One run's processes: rollout servers and trainer ranks started, rank 0 run here, all torn down."""

    def __init__(
        self, cfg: RunConfig, run_dir: Path, display: Display, stops: StopWatch, standbys: dict | None = None
    ) -> None:
        self.cfg, self.run_dir, self.display, self.stops = cfg, run_dir, display, stops
        self.standbys = standbys if standbys is not None else {}  # server index -> its standby Child
        self.procs = ProcessSet(run_dir / "logs", emit=display.log_line)
        self.own_addresses: list[str] = []  # the ipc sockets of the servers this run started
        self.servers, self.ranks = rollout_role(cfg), trainer_role(cfg)  # what each role reads of the run
        self.placement = plan(self.servers, cfg.trainer, visible_gpus())  # checked in pre-flight
        cfg.sync.transport = self.placement.sync_transport  # what the launched engines were set up for
        self.restarts = ServerRestarts(
            self.procs,
            cfg.rollout.max_restarts,
            cfg.rollout.restart_on_failure,
            stop=stops.report,
            note=lambda text: display.note(escape(text)),
        )

    def run(self) -> int:
        cfg = self.cfg
        write_config(cfg, self.run_dir)
        _, secret_env = secret_overrides(cfg)  # the children read the secrets their role files leave out from here
        env = dict(_trace_env(cfg, self.run_dir), **secret_env)
        with self.display:
            self.display.log(self.placement.describe())
            addresses = self._start_servers(env) + list(cfg.rollout.servers)
            startup.mark("launch")
            self._start_ranks(env)
            self.procs.watch(self.restarts.on_death)
            code = self._run_rank0(addresses)
        if code == 0 and cfg.checkpoint.export_hf:
            self.procs.begin_stop()  # the servers and ranks are done: they end while the export runs
            code = _export_hf(self.run_dir, self.display)
        return code

    def tear_down(self) -> None:
        """Children stopped by process group, what they left in /dev/shm and their sockets removed."""
        started = time.monotonic()
        for child in self.standbys.values():  # the run ended before it started their servers
            child.stop(timeout_s=2.0)
        removed = self.procs.stop_all()
        self.display.log(f"stopped every child in {time.monotonic() - started:.1f} s")
        if removed:  # vLLM leaves its psm_* buffers even when stopped cleanly: worth a log line, not a console one
            self.display.log(f"removed what stopped children left in /dev/shm: {', '.join(removed)}")
        remove_sockets(self.own_addresses)
        _close_distributed()
        self.display.close_log()

    def _start_servers(self, env: dict) -> list[str]:
        from rlx.net import server_address

        for index in range(self.cfg.rollout.servers_to_launch):
            address = server_address(self.cfg.rollout, self.cfg.trainer.output_dir, index)
            slot = self.placement.server(index)
            role = slot.serving(self.servers)
            if self.cfg.rollout.engine_weights == "first_sync":  # the servers this run starts, never one by hand
                role = dataclasses.replace(role, placeholder_weights=True)
            role_file = write_role(role, self.run_dir / "roles" / f"rollout{index}.json")
            args = ["rollout-serve", str(role_file), "--address", address, "--index", str(index)]
            argv = python_argv("rlx", *args)
            server_env = dict(env, **server_env_of(self.cfg, slot))
            standby = self.standbys.pop(index, None)
            if standby is not None and standby.alive() and standby.requested_env == server_env:
                self.procs.adopt(standby, argv, args)
            else:  # none, or one started with other settings (the layout differs from the one it was planned on)
                if standby is not None:
                    had = standby.requested_env
                    changed = sorted(k for k in {*server_env, *had} if server_env.get(k) != had.get(k))
                    self.display.log(f"rollout{index}: started anew, not from its standby (changed: {changed})")
                    standby.stop(timeout_s=2.0)
                self.procs.start(f"rollout{index}", argv, server_env)
            self.own_addresses.append(address)
        return list(self.own_addresses)

    def _start_ranks(self, env: dict) -> None:
        world = self.cfg.trainer.num_ranks
        if world <= 1:
            return
        role_file = write_role(self.ranks, self.run_dir / "roles" / "trainer.json")
        port = free_port()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK="0")
        for rank in range(1, world):
            rank_env = dict(
                env,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                WORLD_SIZE=str(world),
                RANK=str(rank),
                **self.placement.rank(rank).env(os.environ.get("CUDA_VISIBLE_DEVICES")),
            )
            self.procs.start(f"trainer{rank}", python_argv("rlx.trainer.ranks", str(role_file)), rank_env)

    def _run_rank0(self, addresses: list[str]) -> int:
        """Build the trainer and the controller while the servers load their engines, then train."""
        from rlx.trace import tracer
        from rlx.trainer.ranks import init_distributed
        from rlx.trainer.trainer import Trainer

        cfg, run_dir, display = self.cfg, self.run_dir, self.display
        if cfg.trace.enabled:
            tracer.configure(_trace_dir(cfg, run_dir), role="trainer", name="trainer0")
        try:
            init_distributed(_device_type(cfg))
            trainer = Trainer(self.ranks)
            startup.mark("trainer_built")
            evals = asyncio.run(self.stops.guard(self._control(trainer, addresses)))
        finally:
            tracer.close()
        display.note(done_line(cfg, run_dir, evals))
        return 0

    async def _control(self, trainer, addresses: list[str]) -> list[tuple[int, float]]:
        """Train; the (step, held-out accuracy) pairs measured."""
        from rlx.orchestrator.controller import Controller
        from rlx.rollout.client import RolloutClient

        cfg = self.cfg
        client = RolloutClient(
            addresses,
            token=cfg.rollout.auth_token,
            timeout_s=cfg.rollout.request_timeout_s,
            awaits_restarts=cfg.rollout.restart_on_failure,
        )
        controller = None
        try:
            controller = Controller(cfg, self.run_dir, client, trainer, self.display)
            warm_s = await asyncio.to_thread(trainer.warm_up)  # while the engines load
            startup.mark("warmed_up")
            if warm_s:
                self.display.log(f"trainer warmed up (its kernels compiled) in {warm_s:.1f} s")

            def alive():
                return all(c.alive() for c in self.procs.children)

            healths = await client.wait_ready(cfg.rollout.startup_timeout_s, is_alive=alive)
            launched = healths[: cfg.rollout.servers_to_launch]  # rollout.servers come after them
            self.display.log(write_startup(self.run_dir, {f"rollout{i}": h.startup for i, h in enumerate(launched)}))
            self.display.note(f"rollout servers ready: {', '.join(addresses)}{_openai_endpoints(cfg)}")
            self.restarts.attach(controller)
            await controller.run()
            return controller.evals
        finally:
            self.restarts.detach()
            if controller is not None:
                controller.close()
            client.close()


def server_env_of(cfg: RunConfig, slot) -> dict[str, str]:
    """What a launched server's environment adds to the run's: quiet vLLM, CPU priority, its GPUs."""
    return dict(**quiet_server_env(), **_server_priority(cfg), **slot.env(os.environ.get("CUDA_VISIBLE_DEVICES")))


def start_standbys(cfg: RunConfig, run_dir: Path) -> dict:
    """One standby process per server the run launches (``rlx.cli.standby``), started before the pre-flight
    with the environment the server will have: it imports its engine meanwhile and becomes the server when the
    launch hands it its command line. None where the layout does not plan (the pre-flight names why)."""
    from rlx.launch.processes import Child

    if not cfg.rollout.servers_to_launch:
        return {}
    try:
        layout = plan(rollout_role(cfg), cfg.trainer, visible_gpus())
    except Exception:  # noqa: BLE001 - a layout error is the pre-flight's to report; without a plan, no standby
        return {}
    _, secret_env = secret_overrides(cfg)
    env = dict(_trace_env(cfg, run_dir), **secret_env)
    argv = python_argv("rlx.cli.standby", cfg.rollout.backend)
    standbys = {}
    for index in range(cfg.rollout.servers_to_launch):
        wanted = dict(env, **server_env_of(cfg, layout.server(index)))
        standbys[index] = Child(
            f"rollout{index}", argv, child_env(wanted), None, print, standby=True, requested_env=wanted
        )
    return standbys


def _openai_endpoints(cfg: RunConfig) -> str:
    """``; OpenAI endpoint(s): URL, ...`` of the launched servers (rollout.openai_port), else ""."""
    from rlx.rollout.openai_http import openai_url

    r = cfg.rollout
    if not (r.openai_port and r.servers_to_launch):
        return ""
    urls = [openai_url(r.openai_host, r.openai_port + i) for i in range(r.servers_to_launch)]
    return f"; OpenAI-compatible endpoint{'s' if len(urls) > 1 else ''}: {', '.join(urls)}"


def _export_hf(run_dir: Path, display: Display) -> int:
    """The newest checkpoint as run_dir/hf, by `rlx convert-ckpt`'s own job in this process: a process of its own
    cost the run's end a new interpreter and its imports, part of the 7 s an export of SmolLM2 took on an H200."""
    from rlx.convert.convert_ckpt import ConvertOptions, build_job
    from rlx.convert.destination import check_destination
    from rlx.convert.fp8.parallel import default_workers

    source, target = run_dir / "checkpoints", run_dir / "hf"
    try:
        job = build_job(source, ConvertOptions(workers=default_workers()))
        job.run(check_destination(target, source, overwrite=True), None, show_progress=False)
    except Exception as exc:  # noqa: BLE001 - the run itself is done: its checkpoints stay, and this line says why
        display.note(
            f"[red]export to Hugging Face failed:[/] {escape(str(exc))}; `rlx convert-ckpt {source} DIR` retries it"
        )
        return 1
    display.note(f"exported the final checkpoint to {target} (loads in transformers and vLLM)")
    return 0


def _trace_dir(cfg: RunConfig, run_dir: Path) -> Path:
    return Path(cfg.trace.dir) if cfg.trace.dir else run_dir / "trace"


def _trace_env(cfg: RunConfig, run_dir: Path) -> dict:
    from rlx.trace import ENV_TRACE_DIR

    return {ENV_TRACE_DIR: str(_trace_dir(cfg, run_dir))} if cfg.trace.enabled else {}


def quiet_progress_bars() -> None:
    """No transformers / huggingface_hub tqdm bars in this process and the children it starts (they inherit the
    environment; on Ray, ``progress_bar_env`` goes with each process): a run loads a model in the trainer, in each
    server, for a reference model or a teacher, and each load drew its own 'Loading weights' bar. The run's
    console has its progress bar and step lines. HF_HUB_DISABLE_PROGRESS_BARS=0 in the environment keeps them."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def progress_bar_env() -> dict[str, str]:
    """The launcher's choice of transformers' progress bars (``quiet_progress_bars``), for a process started on
    another node, whose environment is that node's."""
    return {"HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1")}


def quiet_server_env() -> dict[str, str]:
    """What a launched server's console is spared: vLLM's info lines, and the multiprocessing resource
    tracker's warning at exit about vLLM's shared-memory queues (which the tracker then unlinks itself)."""
    warnings = [w for w in (os.environ.get("PYTHONWARNINGS", ""), "ignore:resource_tracker:UserWarning") if w]
    level = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")  # a level the user set shows vLLM's own timings
    return {"VLLM_LOGGING_LEVEL": level, "PYTHONWARNINGS": ",".join(warnings)}


def _server_priority(cfg: RunConfig) -> dict:
    """``rollout.yield_cpu``: servers on this CPU-only host yield to the trainer: no engine idle spin in
    any mode, and idle priority in sync mode, where the trainer waits while they generate and they wait
    while it trains."""
    if not (cfg.rollout.yield_cpu and _device_type(cfg) == "cpu"):
        return {}
    env = {ENV_NO_SPIN: "1"}
    if cfg.trainer.mode == "sync":
        env[ENV_SCHED_IDLE] = "1"
    return env


def _device_type(cfg: RunConfig) -> str:
    from rlx.placement import device_type

    return device_type(cfg.trainer.device)


def _close_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
