"""What every `loop-governor` command shares: its flags, its input errors, its help.

* A boolean setting is a pair, `--json/--no-json`, never a flag that looks like it takes
  a value: [`flag`][loop_governor.cli.common.flag] declares one.
* Input that is not what a command reads (a file that is not a trace, a store that does
  not exist) is a usage error: one line on stderr saying what was expected, exit status
  2, through [`usage_error`][loop_governor.cli.common.usage_error] (typer's own error box
  spans a dozen lines).
* [`Group`][loop_governor.cli.common.Group], the root command's class, shows flags in
  `--help` without the `<bool>` placeholder typer gives every option (`--help` and
  `--version` included), in every sub-command.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

import typer
from typer.core import TyperGroup


def flag(name: str, help: str, *short: str) -> Any:
    """A boolean option `--name/--no-name` (and its `short` names) for `Annotated[bool, ...]`."""
    return typer.Option(f"--{name}/--no-{name}", *short, help=help, metavar="")


def usage_error(message: str) -> NoReturn:
    """Stop the command: `message` (what was given, what was expected) as one line on
    stderr, exit status 2 (a usage error, as for an unknown option)."""
    typer.echo(f"loop-governor: error: {' '.join(message.split())}", err=True)
    raise typer.Exit(2)


def missing_local_store(url: str) -> Path | None:
    """The path of a `file://` or `sqlite:///` store URL that names nothing on disk (else
    None): an operator's command reading such a store must not create an empty one and
    report "nothing there" for a typo."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    path: Path | None = None
    if scheme == "file":
        path = Path(unquote(urlsplit(url).path))
    elif scheme == "sqlite" and url.lower().startswith("sqlite:///"):
        # SQLAlchemy's convention: sqlite:///relative.db, sqlite:////absolute/path.db
        path = Path(unquote(url[len("sqlite:///") :].split("?", 1)[0]))
    if path is not None and str(path) and not path.exists():
        return path
    return None


def _commands(command: Any) -> Iterator[Any]:
    yield command
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _commands(sub)


def _hide_flag_placeholders(root: Any) -> None:
    """Every flag (the help option too) of every command under `root` shown without a
    value placeholder: typer's rich help prints the metavar, `<bool>` for a flag."""
    for command in _commands(root):
        options = list(command.params)
        helper = command.get_help_option(command.context_class(command))
        if helper is not None:
            options.append(helper)
        for option in options:
            if getattr(option, "is_flag", False) and option.metavar is None:
                option.metavar = ""


class Group(TyperGroup):
    """The `loop-governor` command group: fixes the flags' help once, before it runs."""

    _conventions_applied = False

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        if not self._conventions_applied:
            _hide_flag_placeholders(self)
            self._conventions_applied = True
        return super().main(args, *rest, **kwargs)
