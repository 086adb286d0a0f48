"""`lifecycle serve`: a read-only browser over a snapshot of the ledger (Datasette, extra `ui`).

The snapshot's temporary folder lives while the server runs. Uvicorn shuts down on SIGINT or SIGTERM,
then re-raises the signal to the handler it found: ours returns cleanly (exit 0), so the folder is
always removed (SIGHUP, a closed terminal, is passed on as SIGTERM).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from lifecycle_fsm.cli.app import install_hint, root_obj
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.store.open import is_postgres_url

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["serve"]

_QUERY_PAGE = "assets/serve-query.html"  # a canned query's page, without the SQL editor and its buttons


class _Stopped(Exception):
    """The server was asked to stop (SIGINT or SIGTERM)."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signum)


def _hang_up(signum: int, frame: FrameType | None) -> None:
    """Its terminal closed: stop as on SIGTERM, which uvicorn shuts down on cleanly (then `_stop`)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGTERM)


def _usable_port(host: str, port: int) -> int:
    """The port to serve on, bound once first: a port in use or a host not this machine's is exit 3; port 0
    is a free port picked here, so the address printed is the one served."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise InputError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}; check --host") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no refusal
        try:
            probe.bind(address)
        except OSError as e:
            raise InputError(
                f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port (or --host)"
            ) from None
        return int(probe.getsockname()[1])


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8001, show_default=True)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name (repeatable), e.g. the name a proxy serves it under.",
)
def serve(host: str, port: int, allow_hosts: tuple[str, ...]) -> None:
    """Browse a snapshot of the ledger in Datasette: canned queries, no SQL, no writes, no downloads.

    Queries: rejections, recoveries, candidate_events (?id=), ready_at (?time=ISO; a time
    that does not parse is refused, HTTP 400, saying why), chain_head, seals. Only requests
    for the address served (and, on loopback, localhost) are answered, against DNS
    rebinding; on 0.0.0.0 or ::, requests for any IP address. Needs the `ui` extra.
    """
    import signal
    import tempfile
    from importlib import resources

    from lifecycle_fsm.replay.browse import metadata, snapshot

    try:
        from datasette.cli import cli as datasette_cli
        from datasette.plugins import pm
        from datasette.utils import tilde_encode
    except ImportError:
        raise InputError(f"serve needs Datasette: {install_hint('ui')}") from None
    from lifecycle_fsm.cli.serve_plugin import ServePlugin, allowed_hosts, quiet_refused_times

    db = str(root_obj()["db"])
    if is_postgres_url(db):
        raise InputError("serve browses a SQLite ledger file: copy this one first (`lifecycle migrate URL FILE.db`)")
    ledger = Path(db)
    if not ledger.is_file():
        raise InputError(f"no ledger at {ledger} (serve browses an existing SQLite ledger file)")
    port = _usable_port(host, port)
    if pm.get_plugin("lifecycle_fsm") is not None:  # served before in this process
        pm.unregister(name="lifecycle_fsm")
    pm.register(ServePlugin(allowed_hosts(host, allow_hosts)), name="lifecycle_fsm")
    with tempfile.TemporaryDirectory(prefix="lifecycle-serve-") as folder:
        snap = snapshot(ledger, Path(folder))
        templates = Path(folder) / "templates"
        templates.mkdir()
        (templates / "query.html").write_bytes(
            resources.files("lifecycle_fsm.replay").joinpath(_QUERY_PAGE).read_bytes()
        )
        # Datasette's own path for the database: a stem with a space, a dot or a non-ASCII letter is tilde-encoded
        # (`a b.v2` -> `a+b~2Ev2`). An IPv6 host goes in brackets.
        path = "/" + tilde_encode(snap.name)
        meta = Path(folder) / "metadata.json"
        meta.write_bytes(orjson.dumps(metadata(snap, path), option=orjson.OPT_INDENT_2))
        where = f"[{host}]" if ":" in host else host
        click.echo(f"serving {ledger} as of seq {snap.head_seq} at http://{where}:{port}{path}", err=True)
        args = ["serve", "-i", str(snap.path), "-m", str(meta), "--template-dir", str(templates)]
        args += ["--host", host, "--port", str(port)]
        for setting in ("default_allow_sql", "allow_download", "allow_csv_stream"):
            args += ["--setting", setting, "off"]
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup it is meant to outlive the terminal
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _hang_up)
        hook, sys.unraisablehook = sys.unraisablehook, quiet_refused_times(sys.unraisablehook)
        try:
            datasette_cli.main(args=args, prog_name="lifecycle serve", standalone_mode=False)
        except _Stopped:
            click.echo("stopped", err=True)
        finally:
            sys.unraisablehook = hook
            for sig, handler in previous.items():
                signal.signal(sig, handler)
