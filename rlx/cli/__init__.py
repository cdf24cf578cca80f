"""The `rlx` command line. One module per subcommand; each keeps heavy imports in its body.

Importing this package must not import vLLM, megatron or textual (a test checks it), so that
`rlx --help` is instant and works where those are not installed.
"""

from __future__ import annotations

import importlib

import typer

from rlx import __version__
from rlx.cli.common import FlagCommand, FlagGroup

app = typer.Typer(
    name="rlx",
    help="Reinforcement-learning post-training for LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=FlagGroup,
)

# (module, attribute): a typer.Typer is added as a group, a function as a command.
_COMMANDS = [
    ("rlx.cli.config_cmd", "config_app", "config"),
    ("rlx.cli.train", "train", "train"),
    ("rlx.cli.eval", "eval_cmd", "eval"),
    ("rlx.cli.doctor", "doctor", "doctor"),
    ("rlx.cli.rollout_serve", "rollout_serve", "rollout-serve"),
    ("rlx.cli.plot", "plot", "plot"),
    ("rlx.cli.bench_sync", "bench_sync", "bench-sync"),
    ("rlx.cli.convert_ckpt", "convert_ckpt", "convert-ckpt"),
    ("rlx.cli.fp8_convert", "fp8_convert", "fp8-convert"),
    ("rlx.cli.trace_view", "trace_view", "trace-view"),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Reinforcement-learning post-training for LLMs."""


for _module, _attr, _name in _COMMANDS:
    _obj = getattr(importlib.import_module(_module), _attr)
    if isinstance(_obj, typer.Typer):
        app.add_typer(_obj, name=_name, cls=FlagGroup)
    else:
        app.command(name=_name, cls=FlagCommand)(_obj)


def main() -> None:
    app()
