"""Helpers shared by the subcommands: the console and turning user errors into exit codes."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import typer
import typer.core
from rich.console import Console

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


class _Flags:
    """Help that shows a flag (``--resume``, ``--help``) as a flag: typer labels it ``<bool>``, which reads as if
    it took a value. Mixed into a typer command or group."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _as_flag(param)

    def get_help_option(self, ctx):
        return _as_flag(super().get_help_option(ctx))


class FlagCommand(_Flags, typer.core.TyperCommand):
    pass


class FlagGroup(_Flags, typer.core.TyperGroup):
    pass


def _as_flag(param):
    if param is not None and getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
        param.metavar = ""
    return param


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

        err_console.print(f"[bold red]error:[/] {escape(printable(str(exc)))}", highlight=False, markup=True)
        raise typer.Exit(2) from None


# control characters but tab and newline (ESC starts every terminal escape sequence), bidi overrides and isolates
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with the characters that could drive the terminal shown as escapes (``\\x1b``): error messages
    quote paths, overrides and names exactly as the user (or a file) gave them."""
    return _CONTROL.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text
    )
