"""The `loop-governor` command line.

Each feature area owns its sub-commands in its own module (a ``register(app)`` function),
so this file only lists those modules: adding a command never means editing another
area's code.
"""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from loop_governor import __version__
from loop_governor.cli.common import Group

app = typer.Typer(
    name="loop-governor",
    help="Reliable agent loops: benchmark, replay, report, checkpoints, breakers.",
    no_args_is_help=True,
    add_completion=False,
    cls=Group,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"loop-governor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Reliable agent loops: benchmark, replay, report, checkpoints, breakers."""

# Dotted module names, each defining ``register(app: typer.Typer) -> None``.
COMMAND_MODULES: tuple[str, ...] = (
    "loop_governor.demo",
    "loop_governor.cli.report",
    "loop_governor.cli.replay",
    "loop_governor.cli.checkpoints",
    "loop_governor.cli.breakers",
    "loop_governor.cli.bench",
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_all()


def main() -> None:  # pragma: no cover - thin entry point
    app()
