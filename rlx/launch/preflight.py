"""Checks that run before any process of `rlx train` starts: the Hub ids resolved (``rlx.launch.hub_models``),
the layout, the run directory, the model directories (built first when ``model.build_if_missing`` asks for it),
then every role's checks of its own inputs, from one list (``ROLE_CHECKS``, which ``rlx doctor`` runs too): the
checkpoint plugins, the metric sinks' packages, the trainer's model and teacher, the rollout engine's split of the
model, an external agent's settings, the task's data and prompts and reward, the agent's tools, the rollout dump;
last the checkpoint ``--resume`` continues from and the buffers of killed runs. A mistake found here is one line
naming the fix; nothing has been started and nothing in the run directory was written.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from rlx import placement
from rlx.config.errors import ConfigError
from rlx.config.roles import RolloutRole, TrainerRole, rollout_role, trainer_role
from rlx.launch.build_target import check_build_target
from rlx.launch.display import Display
from rlx.launch.hub_models import resolve_run_models
from rlx.trainer.preflight import build_model, build_warmstart_model, check_resume

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


@dataclass
class RunInputs:
    """What the role checks read: the whole run (for the orchestrator's checks), each role's view of it, and the
    task once its check has built it."""

    cfg: RunConfig
    servers: RolloutRole
    ranks: TrainerRole
    task: Any = None


@dataclass(frozen=True)
class RoleCheck:
    what: str
    target: str
    """``module:function`` of the role that owns the check, imported when it runs."""
    args: Callable[[RunInputs], tuple]
    """The inputs of the run the function takes: its sections or its role's view."""
    keep: str = ""
    """The ``RunInputs`` field the function's result is kept in, for the checks after it."""

    def run(self, inputs: RunInputs) -> Any:
        module, _, name = self.target.partition(":")
        result = getattr(importlib.import_module(module), name)(*self.args(inputs))
        if self.keep:
            setattr(inputs, self.keep, result)
        return result


ROLE_CHECKS = (
    RoleCheck("checkpoint plugins", "rlx.plugins:check_loadable", lambda i: (i.cfg.checkpoint.plugins,)),
    RoleCheck("metric sinks", "rlx.trace.sinks:check_sinks", lambda i: (i.cfg.logging,)),
    RoleCheck("trainer", "rlx.trainer.preflight:check_trainer", lambda i: (i.ranks,)),
    RoleCheck("rollout engine", "rlx.rollout.preflight:check_rollout", lambda i: (i.servers,)),
    RoleCheck("external agent", "rlx.orchestrator.external:check_config", lambda i: (i.cfg,)),
    RoleCheck(
        "task", "rlx.tasks.preflight:check_task", lambda i: (i.cfg.task, i.cfg.model.path, i.cfg.rollout), "task"
    ),
    RoleCheck(
        "agent", "rlx.agent.tools:check_agent", lambda i: (i.cfg.agent, i.cfg.task.reward, i.task, i.cfg.task.eval_k)
    ),
    RoleCheck(
        "rollout dump",
        "rlx.store.preflight:check_store",
        lambda i: (i.cfg.model.path, i.cfg.rollout, i.cfg.trainer.total_steps),
    ),
)
"""Every role's check of its inputs, in the order a user would fix them (the agent's needs the task built)."""

STALE = (
    ("rlx.sync.transports.shm:remove_stale_segments", "the weight-sync buffer"),
    ("rlx.store.preflight:remove_stale", "the sample store"),
)
"""What killed runs leave in /dev/shm, removed before a run starts: ``module:function`` and what it removes."""


def preflight(cfg: RunConfig, display: Display) -> int | None:
    """Fail before any process starts: layout, run directory, model directories, each role's inputs, resume.
    Returns the step ``--resume`` continues from (None without --resume or a checkpoint)."""
    run_dir = Path(cfg.trainer.output_dir).resolve()
    resolve_run_models(cfg, run_dir, lambda text: display.note(escape(text)))  # Hub ids: every process reads the same
    inputs = RunInputs(cfg, rollout_role(cfg), trainer_role(cfg))
    placement.check(inputs.servers, cfg.trainer, placement.visible_gpus())
    placement.plan(inputs.servers, cfg.trainer, placement.visible_gpus())  # the weight transport the layout allows
    check_output_dir(run_dir)
    build_missing(cfg, display)
    if cfg.placement.offload is None:  # every process of the run reads the value the launcher settles here
        gpu = placement.gpu_bytes(cfg.trainer, cfg.placement)
        cfg.placement.offload, why = placement.resolve_offload(inputs.ranks, inputs.servers, gpu)
        if cfg.placement.mode == "colocated":
            display.log(f"placement: {why}")
    for check in ROLE_CHECKS:
        check.run(inputs)
    resumed_step = None
    if cfg.trainer.resume:
        note = lambda text: display.note(escape(text))  # noqa: E731
        resumed_step = check_resume(inputs.ranks, cfg.task.seed, len(inputs.task.train), run_dir, note)
    for target, what in STALE:
        module, _, name = target.partition(":")
        for path in getattr(importlib.import_module(module), name)():
            display.note(f"removed {path}, {what} of an rlx run that was killed")
    return resumed_step


def build_missing(cfg: RunConfig, display: Display) -> None:
    """The model (and the distillation teacher) that ``build_if_missing`` asks for, where it is missing and the
    path is one the user meant (``check_build_target``)."""
    model, distill = cfg.model, cfg.algorithm.distill
    if model.build_if_missing and not Path(model.path, "config.json").is_file():
        check_build_target(model.path, "model.path", "model.build_if_missing", model.build_if_missing, display)
        build_model(model, cfg.task, cfg.trainer.seed, display.note, display.console)
    if distill.teacher and distill.teacher_build_if_missing and not Path(distill.teacher, "config.json").is_file():
        build, key = distill.teacher_build_if_missing, "algorithm.distill.teacher_build_if_missing"
        check_build_target(distill.teacher, "algorithm.distill.teacher", key, build, display)
        build_warmstart_model(
            build, distill.teacher, cfg.task, cfg.trainer.seed, display.note, display.console, "the teacher"
        )


def check_output_dir(run_dir: Path) -> None:
    """``trainer.output_dir`` is a directory, or can be created as one, and is writable."""
    too_long = [part for part in run_dir.parts if len(os.fsencode(part)) > 255]
    if too_long:
        raise ConfigError(
            f"trainer.output_dir has a name of {len(os.fsencode(too_long[0]))} bytes "
            f"({too_long[0][:40]}...); file systems allow 255; set trainer.output_dir to a shorter path"
        )
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == run_dir else f"lies under {existing}, which is a file"
        raise ConfigError(f"trainer.output_dir={str(run_dir)!r} {what}; set trainer.output_dir to a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"trainer.output_dir={str(run_dir)!r}: {existing} is not writable; set "
            "trainer.output_dir to a directory you can write"
        )
