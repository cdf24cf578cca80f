"""The CLI surface (commands and their options) is snapshotted so flags do not pile up unnoticed.

After a deliberate change, refresh it with: RLX_UPDATE_CLI_SNAPSHOT=1 pytest tests/cli/test_cli_surface.py
"""

import os
from pathlib import Path

import typer

from rlx.cli import app

SNAPSHOT = Path(__file__).with_name("cli_surface.txt")


def surface(command, prefix: str = "rlx") -> list[str]:
    """One line per command: its arguments as <name> and its options by flag."""
    lines = []
    params = sorted(
        "/".join(p.opts + p.secondary_opts) if p.param_type_name == "option" else f"<{p.name}>" for p in command.params
    )
    lines.append(f"{prefix}: {' '.join(params)}".rstrip())
    if hasattr(command, "commands"):
        for name in sorted(command.commands):
            lines += surface(command.commands[name], f"{prefix} {name}")
    return lines


def test_cli_surface_matches_snapshot():
    current = "\n".join(surface(typer.main.get_command(app))) + "\n"
    if os.environ.get("RLX_UPDATE_CLI_SNAPSHOT"):
        SNAPSHOT.write_text(current)
    assert current == SNAPSHOT.read_text(), (
        "the CLI surface changed; if that is intended, refresh tests/cli/cli_surface.txt "
        "(RLX_UPDATE_CLI_SNAPSHOT=1) and review the diff"
    )
