"""`rlx eval`: the rollout servers of a checkpoint, its held-out (or benchmark) evaluation, and the report.

The run config's rollout section is the engine (``rollout.backend``, its dtype, context and sizes) with
``model.path`` set to the checkpoint, and its task makes the prompts as training made them. Servers are started as
`rlx train` starts them (role files, environment, placement), in a directory of their own under the system's temp
directory, and stopped by process group however the evaluation ends; a failure keeps that directory (its logs)
and names it. ``rollout.servers`` (already running, with ``rollout.num_servers=0``) are used instead when set: each
must serve the --model directory with its weights unchanged. The metrics are ``rlx.orchestrator.evaluate``'s,
reached through the collector `rlx train` evaluates with (``make_rollouts``), so the two cannot disagree.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.config.roles import rollout_role, write_role
from rlx.launch.launcher import quiet_progress_bars, server_env_of
from rlx.launch.processes import ProcessSet, python_argv
from rlx.launch.run_dir import remove_sockets

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig
    from rlx.orchestrator.evaluate import ModelSource
    from rlx.tasks import Task


def run_eval(cfg: RunConfig, source: ModelSource, command: list[str]) -> dict:
    """Evaluate ``source`` (``cfg.model.path`` already set to it) on ``cfg.task``'s held-out split; the report."""
    from rlx.tasks import build_task

    quiet_progress_bars()
    if cfg.task.name == "external":
        raise ConfigError(
            "task.name=external has no prompts of its own (an outside agent drives its episodes); evaluate a task "
            "rlx makes prompts for, e.g. task.name=gsm8k task.path=... with the agent's data"
        )
    task = build_task(cfg.task, cfg.model.path)
    if not task.eval:
        raise ConfigError("the task has no held-out problems; set task.num_eval > 0, task.eval_path or task.eval_split")
    from rlx.agent.tools import check_eval_k

    check_eval_k(cfg.task.eval_k, cfg.agent, task)
    from rlx.tasks.preflight import check_prompts

    check_prompts(task, cfg.model.path, cfg.rollout)  # a prompt the engine would refuse, named before it starts
    work = Path(tempfile.mkdtemp(prefix="rlx-eval-"))
    procs = ProcessSet(work / "logs", emit=lambda line: None)
    started = time.perf_counter()
    addresses: list[str] = []
    try:
        addresses = _start_servers(cfg, work, procs)
        metrics = asyncio.run(_evaluate(cfg, task, source, addresses + list(cfg.rollout.servers), procs))
    except BaseException as exc:
        exc.add_note(f"the rollout servers' logs are in {work / 'logs'}")
        raise
    finally:
        procs.stop_all()
        remove_sockets(addresses)
    shutil.rmtree(work, ignore_errors=True)
    return report(cfg, task, source, metrics, command, time.perf_counter() - started)


def _start_servers(cfg: RunConfig, work: Path, procs: ProcessSet) -> list[str]:
    from rlx.net import server_address
    from rlx.placement import plan, visible_gpus

    servers = rollout_role(cfg)
    layout = plan(servers, cfg.trainer, visible_gpus())
    addresses = []
    for index in range(cfg.rollout.servers_to_launch):
        address = server_address(cfg.rollout, str(work), index)
        slot = layout.server(index)
        role_file = write_role(slot.serving(servers), work / "roles" / f"rollout{index}.json")
        argv = python_argv("rlx", "rollout-serve", str(role_file), "--address", address, "--index", str(index))
        procs.start(f"rollout{index}", argv, server_env_of(cfg, slot))
        addresses.append(address)
    return addresses


async def _evaluate(cfg: RunConfig, task: Task, source: ModelSource, addresses: list[str], procs) -> dict:
    from rlx.orchestrator.rollouts import make_rollouts
    from rlx.rollout.client import RolloutClient

    client = RolloutClient(addresses, token=cfg.rollout.auth_token, timeout_s=cfg.rollout.request_timeout_s)
    try:
        await client.wait_ready(cfg.rollout.startup_timeout_s, is_alive=lambda: all(c.alive() for c in procs.children))
        for address, health in zip(addresses, await client.health(), strict=True):
            _check_serves(address, health, source)
        return await make_rollouts(cfg, client, task).evaluate(task.eval)
    finally:
        client.close()


def _check_serves(address: str, health, source: ModelSource) -> None:
    """A running server (rollout.servers) serves the --model directory, its weights as loaded."""
    if Path(health.model).expanduser().resolve() != source.path:
        raise ConfigError(
            f"rollout server {address} serves {health.model}, not --model {source.given} ({source.path}); "
            "start it on that directory, or leave rollout.servers empty and let rlx eval start one"
        )
    if health.weight_version != 0:
        raise ConfigError(
            f"rollout server {address} holds weights updated {health.weight_version} times since it loaded "
            f"{health.model}; restart it, or let rlx eval start a server"
        )


def report(cfg: RunConfig, task: Task, source: ModelSource, metrics: dict, command: list[str], seconds: float) -> dict:
    """The JSON `rlx eval` writes: each metric with the prompts it is over, the model, the engine, the command, and
    for a run's checkpoint what the run logged when it evaluated at that step."""
    from rlx.orchestrator.evaluate import logged_evaluation

    t = cfg.task
    held_out = (
        f"task.eval_path={t.eval_path}"
        if t.eval_path
        else f"task.eval_split={t.eval_split}"
        if t.eval_split
        else f"task.num_eval={t.num_eval} held-out problems of task {t.name}" + (f" ({t.path})" if t.path else "")
    )
    temperature = cfg.trainer.eval_temperature
    return {
        "command": shlex.join(command),
        "commit": _commit(),
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": source.as_dict(),
        "engine": {
            "backend": cfg.rollout.backend,
            "dtype": cfg.model.engine_dtype,
            "max_tokens": cfg.sampling.max_tokens,
        },
        "task": {"name": t.name, "held_out": held_out, "k": t.eval_k},
        "sampling": {
            "accuracy": "greedy" if temperature == 0 else f"temperature {temperature:g}, one seed per prompt",
            "samples": f"{t.eval_k} per prompt at temperature {temperature or cfg.sampling.temperature:g}"
            if t.eval_k > 1
            else "none",
        },
        "metrics": {name: {"value": value, "count": len(task.eval)} for name, value in metrics.items()},
        "run_logged": logged_evaluation(source),
        "seconds": round(seconds, 1),
        "notes": source.notes,
    }


def _commit() -> str:
    """The commit of the rlx source tree this runs from ("unknown" outside a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def write_report(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
