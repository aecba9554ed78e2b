"""``loop-governor breakers``: list the fleet's circuit breakers; open or close one by hand.

An operator who knows a dependency is down (or fixed) should not have to wait for the
agents to find out: ``open`` stops every agent sharing the store from calling the tool
for one cooldown; ``close`` lets them call it again at once.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from loop_governor.cli.common import flag, missing_local_store, usage_error
from loop_governor.redaction import redact
from loop_governor.state.breaker import BreakerState
from loop_governor.stores import Store, store_from_url
from loop_governor.terminal import cell, printable

breakers_app = typer.Typer(
    name="breakers",
    help="List circuit breakers in a shared store (sqlite or redis); open or close one by hand.",
    no_args_is_help=False,
)

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="LOOP_GOVERNOR_STORE_URL",
        help="Store URL: sqlite:///path/state.db or redis://host:port/db[?namespace=NS]. "
        "Default: the governor config (LOOP_GOVERNOR_STORE_URL / LOOP_GOVERNOR_CONFIG_FILE).",
        show_default=False,
    ),
]


def _store_url(option: str | None) -> str:
    if option:
        return option
    from loop_governor.config import GovernorConfig  # reads env/TOML: only when no --store

    return GovernorConfig().store_url


_EXPECTED = "expected the agents' shared store: sqlite:///path/state.db or redis://host:port/db"


def _open_store(option: str | None) -> Store:
    url = _store_url(option)
    err = Console(stderr=True)
    if url.lower().startswith("memory://"):
        usage_error(f"memory:// state lives inside each agent process, no command can read it: {_EXPECTED}")
    missing = missing_local_store(url)
    if missing is not None:  # opening it would create an empty store: "no breakers" for a typo
        usage_error(f"no store at {printable(redact(url))}: {printable(missing)} does not exist: {_EXPECTED}")
    try:
        store = store_from_url(url)
    except (ValueError, ImportError) as exc:
        usage_error(f"{redact(str(exc))}: {_EXPECTED}")
    ping = getattr(store, "ping", None)
    if ping is not None and not ping():
        # The agents' store falls back to local state silently; an operator's command must not.
        err.print(f"[red]cannot reach the store at {cell(getattr(store, 'safe_url', redact(url)))}[/red]")
        store.close()
        raise typer.Exit(1)
    return store


def _when(ts: float) -> str:
    if ts <= 0:
        return "-"
    if ts > 1e9:  # wall-clock seconds (the governor's default clock)
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{ts:.3f}"


@breakers_app.callback(invoke_without_command=True)
def breakers(
    ctx: typer.Context,
    store: StoreOpt = None,
    as_json: Annotated[bool, flag("json", "Print JSON instead of a table.")] = False,
) -> None:
    """List every breaker the store knows (state, consecutive failures, when it opened)."""
    ctx.obj = store
    if ctx.invoked_subcommand is not None:
        return
    st = _open_store(store)
    try:
        rows = st.breaker_list()
    finally:
        st.close()
    if as_json:
        listed = [
            {"tool": r.tool, "state": r.state.value, "failures": r.failures, "opened_at": r.opened_at} for r in rows
        ]
        typer.echo(json.dumps(listed))
        return
    if not rows:
        Console().print("no breakers recorded (every tool is closed)")
        return
    table = Table("tool", "state", "failures", "opened at")
    colour = {BreakerState.CLOSED: "green", BreakerState.OPEN: "red", BreakerState.HALF_OPEN: "yellow"}
    for r in rows:
        table.add_row(cell(r.tool), f"[{colour[r.state]}]{r.state.value}[/]", str(r.failures), _when(r.opened_at))
    Console().print(table)


def _force(ctx: typer.Context, tool: str, store: str | None, state: BreakerState) -> None:
    st = _open_store(store or ctx.obj)
    try:
        st.breaker_force(tool, state, time.time())
        rec = st.breaker_get(tool)
    finally:
        st.close()
    typer.echo(f"{printable(tool)}: {rec.state.value}")


@breakers_app.command("open")
def open_breaker(
    ctx: typer.Context,
    tool: Annotated[str, typer.Argument(help="Tool name as the agents govern it.")],
    store: StoreOpt = None,
) -> None:
    """Open TOOL's breaker now: agents refuse it for one cooldown, then send one probe."""
    _force(ctx, tool, store, BreakerState.OPEN)


@breakers_app.command("close")
def close_breaker(
    ctx: typer.Context,
    tool: Annotated[str, typer.Argument(help="Tool name as the agents govern it.")],
    store: StoreOpt = None,
) -> None:
    """Close TOOL's breaker now and forget its failures: agents call it again at once."""
    _force(ctx, tool, store, BreakerState.CLOSED)


def register(app: typer.Typer) -> None:
    """Add ``breakers`` (list / open / close) to the ``loop-governor`` CLI."""
    app.add_typer(breakers_app, name="breakers")
