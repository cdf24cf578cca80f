"""`rlx doctor`: check a run's layout (devices, memory, ports, /dev/shm, versions, a real broadcast between
nodes) before starting it; exits 1 when it finds a problem."""

from __future__ import annotations

import typer

from rlx.cli.common import user_errors


def doctor(
    config: str = typer.Argument(..., help="YAML run config, e.g. configs/quickstart.yaml."),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides, e.g. launcher=ray."),
    broadcast_mb: int = typer.Option(16, min=1, help="MiB broadcast between every pair of nodes."),
) -> None:
    """Preflight a layout: this host (launcher=local) or every node of the Ray cluster (launcher=ray)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from rlx.config import load_config
    from rlx.launch.doctor import diagnose

    with user_errors():
        cfg = load_config(config, list(overrides or []))
        checks = diagnose(cfg, broadcast_mb)
    console = Console(soft_wrap=True)
    table = Table(title=f"rlx doctor: launcher={cfg.launcher}")
    for column in ("check", "node", "found", ""):
        table.add_column(column, overflow="fold")  # paths and addresses whole, never cut to an ellipsis
    for check in checks:
        table.add_row(
            check.what, escape(check.node), escape(check.found), "[green]ok[/]" if check.ok else "[red]problem[/]"
        )
    console.print(table)
    problems = [check for check in checks if not check.ok]
    for check in problems:
        console.print(
            f"[red]problem[/] {escape(check.what)} on {escape(check.node)}: {escape(check.fix)}", highlight=False
        )
    console.print(f"{len(problems)} problem(s) found" if problems else "no problem found", highlight=False)
    raise typer.Exit(1 if problems else 0)
