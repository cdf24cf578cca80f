"""What `rlx train` says about where its outputs go when a run starts, and when it ends: the closing line of
a finished run, what a stopped run leaves to resume from, and why ``--resume`` of a run already at its last
step trains nothing.

Each line holds in every mode: the trace viewer is suggested only when the run recorded a trace, and
held-out accuracy comes from the run's own metrics (a resumed run's include the steps before it), so
a run that evaluated never says that it did not.
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


def where_things_go(cfg: RunConfig, run_dir: Path, log_name: str) -> str:
    """The run's first line: its directory as an absolute path (trainer.output_dir is relative to where `rlx train`
    runs) and what lands in it."""
    trace = "" if not cfg.trace.enabled else ", trace/" if not cfg.trace.dir else f"; trace in {cfg.trace.dir}"
    return (
        f"run directory {escape(str(run_dir))}: config.yaml, metrics.jsonl, checkpoints/, logs/{log_name} "
        f"(one log per process beside it){escape(trace)}"
    )


def done_line(cfg: RunConfig, run_dir: Path, evals: list[tuple[int, float]]) -> str:
    """The line a finished run ends with (rich markup). ``evals``: the (step, held-out accuracy) pairs this
    process measured, used when the run writes no metrics.jsonl."""
    parts = [
        f"done: run directory {escape(str(run_dir))}",
        _accuracy(cfg, _run_evals(run_dir) or evals),
        f"`rlx plot {escape(str(run_dir))}` draws the curves",
    ]
    if cfg.trace.enabled:
        trace_dir = Path(cfg.trace.dir) if cfg.trace.dir else run_dir / "trace"
        parts.append(f"`rlx trace-view {escape(str(trace_dir))}` shows the timeline")
    else:
        parts.append("no trace recorded (trace.enabled=true records one for `rlx trace-view`)")
    return "; ".join(parts)


def _run_evals(run_dir: Path) -> list[tuple[int, float]]:
    from rlx.trace.sinks import METRICS_FILE, read_metrics

    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    return [(row["step"], row["eval_accuracy"]) for row in read_metrics(path) if _finite(row.get("eval_accuracy"))]


def _accuracy(cfg: RunConfig, evals: list[tuple[int, float]]) -> str:
    evals = [(step, value) for step, value in evals if _finite(value)]
    if evals:
        (first_step, first), (last_step, last) = evals[0], evals[-1]
        return f"held-out accuracy {first:.3f} at step {first_step} -> {last:.3f} at step {last_step}"
    if cfg.task.name == "external":
        return "no held-out accuracy (task.name=external: the agent's episodes have no held-out problems)"
    if not cfg.trainer.eval_every:
        return "no held-out evaluation ran (trainer.eval_every=0)"
    return f"no held-out evaluation was due (trainer.eval_every={cfg.trainer.eval_every})"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def resume_hint(run_dir: Path) -> str:
    """What a run stopped early leaves: its newest complete checkpoint and the command that continues from it."""
    from rlx.trainer.checkpoint import newest_complete_checkpoint

    ckpt, _ = newest_complete_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        return "no checkpoint was written yet; running the same command again starts over"
    step = int(ckpt.name.split("_")[-1])
    return (
        f"the newest complete checkpoint is {escape(str(ckpt))} (step {step}); {escape(resume_command())} "
        "continues from it"
    )


def resume_command() -> str:
    """This command line with ``--resume``, when it is `rlx train`'s (else a description)."""
    args = sys.argv[1:]
    if not args or args[0] != "train":
        return "the same `rlx train` command with --resume"
    return "`rlx " + " ".join(shlex.quote(a) for a in args) + ("" if "--resume" in args else " --resume") + "`"


def already_done(run_dir: Path, step: int, total_steps: int) -> str:
    """``--resume`` of a run whose newest checkpoint is at or past trainer.total_steps."""
    return (
        f"{escape(str(run_dir))} is already at step {step} (trainer.total_steps={total_steps}): nothing to "
        f"train; raise trainer.total_steps (e.g. trainer.total_steps={step + total_steps}) to train further"
    )
