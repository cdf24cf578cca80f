"""The live console of `rlx train`: a progress bar over steps, one line of key metrics per
step, and the children's log lines (prefixed with their name) printed above the bar.

Once the run directory exists the launcher's own log, ``RUN_DIR/logs/train.log``, gets every note
with its time, and the full traceback of whatever stopped the run, which the console names in one line.
"""

from __future__ import annotations

import math
import time
import traceback
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

# (metric, label, format): a metric shows when the step has it, so each algorithm and mode shows its own
# (PPO's critic, distillation's reverse KL, tools, fully_async staleness). "g" keeps small values readable:
# a train/rollout mismatch of 4e-7 is not 0.0000.
KEY_METRICS = (
    ("reward_mean", "reward", "{:.3f}"),
    ("accuracy", "acc", "{:.2f}"),
    ("eval_accuracy", "eval_acc", "{:.3f}"),
    ("response_len_mean", "len", "{:.1f}"),
    ("kl", "kl", "{:.3g}"),
    ("entropy", "ent", "{:.3f}"),
    ("grad_norm", "gnorm", "{:.2f}"),
    ("value_loss", "vloss", "{:.3g}"),
    ("critic_explained_variance", "ev", "{:.2f}"),
    ("distill_reverse_kl", "rkl", "{:.3f}"),
    ("tool_call_success_rate", "tool_ok", "{:.2f}"),
    ("turns_per_episode", "turns", "{:.1f}"),
    ("episodes", "episodes", "{:.0f}"),
    ("staleness_mean", "stale", "{:.2f}"),
    ("rollout_restarts", "restarts", "{:.0f}"),
    ("logprob_diff_mean", "|dlogp|", "{:.2g}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
    ("time_step", "s/step", "{:.2f}"),
)


def format_metrics(metrics: dict[str, float]) -> str:
    parts = []
    for key, label, fmt in KEY_METRICS:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            parts.append(f"{label}={fmt.format(value)}")
    return " ".join(parts)


class Display:
    def __init__(self, total_steps: int, enabled: bool = True, console: Console | None = None) -> None:
        self.console = console or Console(soft_wrap=True)
        self.enabled = enabled
        # the bar only on a terminal: in a log file it is one last frame cut to 80 columns, and the step lines
        # already say everything it does
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
            disable=not (enabled and self.console.is_terminal),
        )
        self.task = self.progress.add_task("", total=total_steps)
        self.log_path: Path | None = None
        self._log: TextIO | None = None
        self._early: list[str] = []  # log lines of the pre-flight, before the run directory's log exists

    def log_to(self, path: Path) -> None:
        """From now on append every note, and any traceback, to ``path``; the lines logged before it go first."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path, self._log = path, open(path, "a", buffering=1)  # noqa: SIM115 - open until close_log()
        self._log.writelines(self._early)
        self._early = []

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Display:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def step(self, step: int, metrics: dict[str, float]) -> None:
        line = format_metrics(metrics)
        self.progress.update(self.task, completed=step, description=line[:60])
        self.console.print(f"[cyan]step {step:>4}[/] {line}", highlight=False)

    def note(self, text: str) -> None:
        self.console.print(f"[bold]rlx:[/] {text}", highlight=False)
        self._write(Text.from_markup(text).plain)

    def log(self, text: str) -> None:
        """A line for the launcher's log only."""
        self._write(text)

    def failure(self, what: str, exc: BaseException, then: str = "") -> None:
        """One console line naming what failed, where its traceback is and ``then`` (rich markup: what happens
        next); the traceback goes to the log."""
        self._write("".join(traceback.format_exception(exc)).rstrip("\n"))
        where = f"; the traceback is in {self.log_path}" if self._log is not None else ""
        then = f"; {then}" if then else ""
        self.note(f"[red]{escape(what)}:[/] {type(exc).__name__}: {escape(str(exc))}{where}{then}")

    def _write(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n"
        if self._log is not None:
            self._log.write(line)
        else:
            self._early.append(line)

    def log_line(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)
