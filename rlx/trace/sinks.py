"""Metric sinks of a run: JSON lines (always readable by `rlx trace-view` and `rlx plot`),
TensorBoard and Weights & Biases when asked for. One ``log(step, metrics)`` feeds them all.

W&B gets the resolved run config with its secrets replaced (``rlx.config.redact``), so a run
page says what was run without leaking the auth token. W&B's own settings (``WANDB_MODE``,
``WANDB_DIR``, the API key) come from its environment variables; resuming a W&B run is left out.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.config.outputs import LoggingConfig

METRICS_FILE = "metrics.jsonl"
# a step's phases in its metrics line (seconds): the finer ones, what holds them (collect: generate and reward;
# train: the whole update call) and the colocated turn switches
STEP_PHASES = (
    "time_generate",
    "time_reward",
    "time_collect",
    "time_logprob",
    "time_update",
    "time_train",
    "time_sync",
    "time_colocate_switch",
)


class JsonlSink:
    def __init__(self, path: Path, resume_from_step: int | None) -> None:
        self.steps: set[int] = set()  # the steps the file holds a line of
        if resume_from_step is not None and path.exists():
            self.steps = _truncate_after(path, resume_from_step)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open until close()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, "time": time.time(), **{k: _finite(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self.steps.add(step)

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "logging.tensorboard=true needs the tensorboard package: pip install tensorboard"
            ) from exc
        self._writer = SummaryWriter(str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    def __init__(self, project: str, run_name: str, config: dict) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("logging.wandb=true needs the wandb package: pip install wandb") from exc
        self._run = wandb.init(project=project, name=run_name, config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class MetricsLogger:
    def __init__(
        self, logging: LoggingConfig, run_name: str, run_config: dict, run_dir: Path, resume_from_step: int | None
    ) -> None:
        """``run_config``: the run's whole config, secrets redacted (``rlx.config.redact.redacted``), which W&B
        records beside the metrics."""
        self.sinks = []
        if logging.jsonl:
            self.sinks.append(JsonlSink(run_dir / METRICS_FILE, resume_from_step))
        if logging.tensorboard:
            self.sinks.append(TensorBoardSink(run_dir / "tb"))
        if logging.wandb:
            self.sinks.append(WandbSink(logging.wandb_project, run_name, run_config))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def log_if_missing(self, step: int, metrics: dict[str, float]) -> None:
        """On resume: log the checkpoint's own line when metrics.jsonl lacks it (the run stopped between the save
        and the line)."""
        jsonl = next((sink for sink in self.sinks if isinstance(sink, JsonlSink)), None)
        if jsonl is not None and step not in jsonl.steps:
            self.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics file; malformed lines (a crash mid-write) are skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _truncate_after(path: Path, step: int) -> set[int]:
    """On resume, drop rows logged after the checkpoint so the curve has no duplicate steps; the steps kept."""
    rows = [row for row in read_metrics(path) if row["step"] <= step]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {row["step"] for row in rows}


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
