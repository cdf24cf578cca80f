"""`rlx train`: a whole RL run from one YAML config."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from rlx.cli.common import user_errors

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


def train(
    config: str = typer.Argument(..., help="YAML run config, e.g. configs/quickstart.yaml."),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides, e.g. trainer.total_steps=5."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest complete checkpoint (same as trainer.resume=true)."
    ),
) -> None:
    """Launch rollout servers and trainer ranks, train, sync weights, checkpoint and log."""
    from rlx.config import load_config

    overrides = list(overrides or []) + (["trainer.resume=true"] if resume else [])
    with user_errors():
        cfg = load_config(config, overrides)
        code = _run(cfg)
    raise typer.Exit(code)


def _run(cfg: RunConfig) -> int:
    """The run on the launcher the config names; the Ray launcher's module is the only one that imports Ray."""
    if cfg.launcher == "ray":
        from rlx.launch.ray_launcher import run_ray_train

        return run_ray_train(cfg)
    from rlx.launch.launcher import run_train

    return run_train(cfg)
