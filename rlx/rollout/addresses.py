"""Default addresses of a run's rollout servers."""

from __future__ import annotations

from pathlib import Path


def server_address(cfg, index: int) -> str:
    """tcp://host:(port+index) when rollout.port is set, else an ipc:// socket in the run directory."""
    if cfg.rollout.port:
        return f"tcp://{cfg.rollout.host}:{cfg.rollout.port + index}"
    path = Path(cfg.trainer.output_dir).resolve() / f"rollout-{index}.sock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"ipc://{path}"
