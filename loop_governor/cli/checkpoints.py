"""``loop-governor checkpoints ls | show | rm``: look into a checkpoint store.

After a crash the first questions are "which tasks can resume, and how far did they
get?"; before a re-run from scratch, "remove this one". A corrupt checkpoint is listed
as such (never skipped), so it is noticed before a resume trips over it.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from loop_governor.checkpoint.base import CheckpointStore
from loop_governor.checkpoint.errors import CheckpointError
from loop_governor.checkpoint.model import TaskCheckpoint
from loop_governor.checkpoint.url import checkpoint_store_from_url
from loop_governor.cli.common import flag, missing_local_store, usage_error
from loop_governor.redaction import mask_url, redact
from loop_governor.terminal import cell

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Checkpoint store URL: file:///dir, sqlite:///path.db, redis://host:port/db. Default: the "
        "governor's own checkpoint_url (LOOP_GOVERNOR_CHECKPOINT_URL, or LOOP_GOVERNOR_CONFIG_FILE).",
        show_default=False,
    ),
]
TaskArg = Annotated[str, typer.Argument(help="The task id.")]
_EXPECTED = "expected an existing checkpoint store: file:///dir, sqlite:///path.db or redis://host:port/db"


def _url(store: str | None) -> str:
    """``--store``, else the checkpoint URL the governor itself would use (its config:
    LOOP_GOVERNOR_CHECKPOINT_URL, the config file), so the CLI looks where the runs wrote."""
    if store:
        return store
    from loop_governor.config import GovernorConfig

    try:
        url = GovernorConfig().checkpoint_url
    except Exception as exc:  # an invalid setting in the environment or the config file
        usage_error(f"invalid LOOP_GOVERNOR_* setting: {redact(str(exc))}")
    if not url:
        usage_error(f"no checkpoint store: pass --store URL or set LOOP_GOVERNOR_CHECKPOINT_URL ({_EXPECTED})")
    return url


def _open(store: str | None) -> CheckpointStore:
    """The store to read. A file or SQLite store that does not exist is a usage error
    (exit 2), not an empty listing: ``file:///typo`` must not read as "0 checkpoints"."""
    url = _url(store)
    try:
        _must_exist(url)
        return checkpoint_store_from_url(url)
    except (ValueError, CheckpointError, ImportError) as exc:
        usage_error(f"{redact(str(exc))}: {_EXPECTED}")


def _must_exist(url: str) -> None:
    path = missing_local_store(url)
    if path is not None:
        raise ValueError(f"no checkpoint store at {mask_url(url)}: {path} does not exist")


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _preview(value: object, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ls(store: StoreOption = None) -> None:
    """List the tasks with a checkpoint: version, step, completed and known-bad calls."""
    console = Console()
    backend = _open(store)
    try:
        ids = backend.list()
        table = Table(title=f"checkpoints in {cell(mask_url(_url(store)))}", title_justify="left")
        table.add_column("task id", overflow="fold")
        for name in ("version", "step", "completed", "known-bad", "results"):
            table.add_column(name, justify="right")
        table.add_column("updated")
        corrupt = 0
        for task_id in ids:
            try:
                cp = backend.load(task_id)
            except Exception as exc:  # one bad checkpoint must not hide the others
                corrupt += 1
                label = "CORRUPT" if isinstance(exc, CheckpointError) else type(exc).__name__
                table.add_row(cell(task_id), f"[red]{cell(label)}[/red]", "", "", "", "", cell(str(exc)))
                continue
            if cp is None:  # deleted between list and load
                continue
            table.add_row(
                cell(task_id),
                str(cp.version),
                str(cp.step),
                str(len(cp.completed)),
                str(len(cp.known_bad)),
                str(len(cp.results)),
                _when(cp.updated_at),
            )
        # Files no task id leads to (a long-id checkpoint too damaged to name its task):
        # listed by file name, so they are noticed, but never passed to load or rm.
        unidentified = getattr(backend, "unidentified", None)
        orphans: list[tuple[str, str]] = unidentified() if callable(unidentified) else []
        for name, reason in orphans:
            corrupt += 1
            table.add_row(f"[dim](file)[/dim] {cell(name)}", "[red]CORRUPT[/red]", "", "", "", "", cell(reason))
        console.print(table)
        summary = f"{len(ids) + len(orphans)} checkpoint(s)"
        if corrupt:
            summary += f", [red]{corrupt} corrupt[/red] (left in place; see the quarantine copy)"
        console.print(summary)
    finally:
        backend.close()


def show(
    task_id: TaskArg,
    store: StoreOption = None,
    as_json: Annotated[bool, flag("json", "Print the checkpoint as JSON.")] = False,
) -> None:
    """Show one checkpoint: completed calls, known-bad calls and sub-task results."""
    console = Console()
    backend = _open(store)
    try:
        cp = _load_or_exit(backend, task_id, console)
    finally:
        backend.close()
    if as_json:
        typer.echo(json.dumps(cp.model_dump(mode="json"), indent=2, ensure_ascii=False))
        return
    console.print(f"[bold]task[/bold] {cell(cp.task_id)}")
    console.print(
        f"version {cp.version} · step {cp.step} · schema {cp.schema_version} · updated {_when(cp.updated_at)}"
    )
    completed = Table(title=f"completed calls ({len(cp.completed)})", title_justify="left")
    completed.add_column("call key", overflow="fold")
    completed.add_column("stored result", overflow="fold")
    for key, value in cp.completed.items():
        completed.add_row(cell(key), cell(_preview(value)))
    console.print(completed)
    known_bad = Table(title=f"known-bad calls ({len(cp.known_bad)})", title_justify="left")
    known_bad.add_column("call key", overflow="fold")
    known_bad.add_column("type")
    known_bad.add_column("status", justify="right")
    known_bad.add_column("message", overflow="fold")
    for key, err in cp.known_bad.items():
        known_bad.add_row(
            cell(key),
            err.error_type.value,
            "" if err.status is None else str(err.status),
            cell(err.message),
        )
    console.print(known_bad)
    results = Table(title=f"sub-task results ({len(cp.results)})", title_justify="left")
    results.add_column("#", justify="right")
    results.add_column("result", overflow="fold")
    for i, value in enumerate(cp.results):
        results.add_row(str(i), cell(_preview(value)))
    console.print(results)
    if cp.metadata:
        console.print(f"metadata: {cell(_preview(cp.metadata, 400))}")


def rm(
    task_id: TaskArg,
    store: StoreOption = None,
    yes: Annotated[bool, flag("yes", "Do not ask for confirmation.", "-y")] = False,
) -> None:
    """Remove a task's checkpoint (the task will start from scratch next time)."""
    console = Console()
    backend = _open(store)
    try:
        if not yes and not typer.confirm(f"Remove the checkpoint of task {task_id!r}?"):
            raise typer.Exit(1)
        if not backend.delete(task_id):
            console.print(f"[red]no checkpoint for task {cell(task_id)!r}[/red]")
            raise typer.Exit(1)
    finally:
        backend.close()
    console.print(f"removed checkpoint of task {cell(task_id)!r}")


def _load_or_exit(backend: CheckpointStore, task_id: str, console: Console) -> TaskCheckpoint:
    try:
        cp = backend.load(task_id)
    except CheckpointError as exc:
        console.print(f"[red]{cell(str(exc))}[/red]")
        raise typer.Exit(2) from None
    if cp is None:
        console.print(f"[red]no checkpoint for task {cell(task_id)!r}[/red]")
        raise typer.Exit(1)
    return cp


def register(app: typer.Typer) -> None:
    """Add the ``checkpoints`` command group to the ``loop-governor`` CLI."""
    group = typer.Typer(help="Inspect and remove task checkpoints.", no_args_is_help=True)
    group.command("ls")(ls)
    group.command("show")(show)
    group.command("rm")(rm)
    app.add_typer(group, name="checkpoints")
