"""What a run writes: the ``checkpoint``, ``logging`` and ``trace`` sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.checks import check_range
from rlx.config.errors import ConfigError


@dataclass
class CheckpointConfig:
    every: int = 0
    """Save a checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep: int = 2
    """Complete checkpoints to keep; older ones are deleted."""
    save_final: bool = True
    """Save a checkpoint after the last step."""
    export_hf: bool = False
    """Also export the final checkpoint as a Hugging Face directory (run_dir/hf)."""
    plugins: list[str] = field(default_factory=list)
    """Installed checkpoint plugins to run (entry-point names in the rlx.plugins group), in this order."""

    def __post_init__(self) -> None:
        check_range("checkpoint.every", self.every, 0)
        check_range("checkpoint.keep", self.keep, 1)
        repeated = sorted({name for name in self.plugins if self.plugins.count(name) > 1})
        if repeated:
            raise ConfigError(f"checkpoint.plugins names {repeated[0]!r} more than once; list each plugin once")


@dataclass
class LoggingConfig:
    console: bool = True
    """Rich live console with a progress bar and a line of metrics per step."""
    jsonl: bool = True
    """Write metrics.jsonl in the run directory."""
    tensorboard: bool = False
    """Write TensorBoard event files under run_dir/tb."""
    wandb: bool = False
    """Log to Weights & Biases (needs the wandb package)."""
    wandb_project: str = "rlx"
    """W&B project name."""


@dataclass
class TraceConfig:
    enabled: bool = False
    """Record spans and events of every process as JSON lines."""
    dir: str = ""
    """Trace directory; empty = run_dir/trace."""
