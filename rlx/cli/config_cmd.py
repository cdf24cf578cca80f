"""`rlx config show|check`: print or validate a run config without running anything."""

from __future__ import annotations

import typer

from rlx.cli.common import FlagCommand, FlagGroup, console, user_errors

config_app = typer.Typer(help="Show or check a run config.", no_args_is_help=True, cls=FlagGroup)


@config_app.command("show", cls=FlagCommand)
def show(
    config: str = typer.Argument(..., help="YAML run config."),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides."),
) -> None:
    """Print the resolved config (YAML) after overrides and validation; secrets are shown as ***."""
    from omegaconf import OmegaConf

    from rlx.config import load_config
    from rlx.config.redact import redacted

    with user_errors():
        cfg = load_config(config, overrides or [])
    console.print(OmegaConf.to_yaml(redacted(cfg)), highlight=False, markup=False, end="")


@config_app.command("check", cls=FlagCommand)
def check(
    config: str = typer.Argument(..., help="YAML run config."),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides."),
) -> None:
    """Validate a config (keys, types, ranges) and exit non-zero on the first problem."""
    from rlx.config import load_config

    with user_errors():
        load_config(config, overrides or [])
    console.print(f"[green]ok[/]: {config} is a valid run config")
