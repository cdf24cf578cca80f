"""Metric sinks of a run: JSON lines (always readable by `rlx trace-view` and `rlx plot`),
TensorBoard and Weights & Biases when asked for. One ``log(step, metrics)`` feeds them all.

W&B gets the resolved run config with its secrets replaced (``rlx.config.redact``), so a run
page says what was run without leaking the auth token, and under ``hub`` the Hub id and commit of
each model the run resolved from the Hub (``rlx.formats.hub``). Its files go to RUN_DIR/wandb
unless ``WANDB_DIR`` says otherwise; a ``--resume`` continues the same W&B run (its id is kept in
RUN_DIR/wandb/rlx_run_id, wherever WANDB_DIR is). W&B's own settings (``WANDB_MODE``, the API key, the entity) come from
its environment variables. ``check_sinks`` refuses, before a run starts, a sink whose package is
not installed, with the line that installs it.
"""

from __future__ import annotations

import json
import math
import os
import secrets
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


INSTALL = {"tensorboard": ("tensorboard", "pip install tensorboard"), "wandb": ("wandb", "pip install wandb")}
"""logging.KEY: the package its sink imports, and the line that installs it."""
WANDB_ID_FILE = "rlx_run_id"


def check_sinks(logging: LoggingConfig) -> None:
    """Every sink ``logging`` turns on can be imported; else a ConfigError with the line that installs it."""
    import importlib

    from rlx.config.errors import ConfigError

    for key, (module, install) in INSTALL.items():
        if getattr(logging, key):
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(
                    f"logging.{key}=true needs the {module} package, which is not installed: {install} "
                    f"(or set logging.{key}=false)"
                ) from None


class WandbSink:
    def __init__(self, project: str, run_name: str, config: dict, run_dir: Path, resuming: bool) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(f"logging.wandb=true needs the wandb package: {INSTALL['wandb'][1]}") from exc
        files = Path(os.environ.get("WANDB_DIR") or run_dir)
        id_file = run_dir / "wandb" / WANDB_ID_FILE  # the run's own, where WANDB_DIR is shared by several
        id_file.parent.mkdir(parents=True, exist_ok=True)
        run_id = id_file.read_text().strip() if resuming and id_file.is_file() else secrets.token_hex(8)
        id_file.write_text(run_id + "\n")
        self._run = wandb.init(
            project=project,
            name=run_name,
            config=dict(config, hub=hub_models(config)),
            dir=str(files),
            id=run_id,
            resume="allow",
        )

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
            resuming = resume_from_step is not None
            self.sinks.append(WandbSink(logging.wandb_project, run_name, run_config, run_dir, resuming))

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


def hub_models(run_config: dict) -> dict:
    """``{key: {"repo_id", "commit"}}`` of each model path of the run that is a Hub snapshot."""
    from rlx.formats.hub import MODEL_KEYS, snapshot_of

    found = {}
    for key in MODEL_KEYS:
        value = run_config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        snap = snapshot_of(value) if isinstance(value, str) and value else None
        if snap is not None:
            found[key] = {"repo_id": snap.repo_id, "commit": snap.commit}
    return found


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
