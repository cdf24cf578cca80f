"""Helpers shared by the subcommands: the console and turning user errors into exit codes."""

from __future__ import annotations

import contextlib
from typing import Iterator

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


class UserError(Exception):
    """An error caused by the user's input; printed without a traceback."""


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Print ConfigError / UserError / FileNotFoundError as one red line and exit 2."""
    from rlx.config.errors import ConfigError

    try:
        yield
    except (ConfigError, UserError, FileNotFoundError) as exc:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        raise typer.Exit(2) from None
