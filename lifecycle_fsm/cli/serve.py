"""`lifecycle serve`: a read-only browser over a snapshot of the ledger (Datasette, extra `ui`).

The snapshot lives in a temporary folder for as long as the server runs and is
removed when it stops. Uvicorn shuts down on SIGINT or SIGTERM and then re-raises the
signal to the handler it found; ours turns it into a clean return (exit 0), so the
folder is always removed. Datasette is imported only here, when the command runs.
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path
from types import FrameType

import click
import orjson

from lifecycle_fsm.cli.app import root_obj
from lifecycle_fsm.errors import InputError

__all__ = ["serve"]


class _Stopped(Exception):
    """The server was asked to stop (SIGINT or SIGTERM)."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signum)


def _usable_port(host: str, port: int) -> int:
    """The port to serve on. A port in use or a host that is not this machine's is one error line (exit 3)
    before anything is said: Uvicorn found it only after "serving … at http://…" was printed, logged it among
    its INFO lines and exited 3 without an `Error:` line. Port 0 is a free port picked here, so the address
    printed is the one served (it said `:0`)."""
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
def serve(host: str, port: int) -> None:
    """Browse a snapshot of the ledger in Datasette: canned queries, no SQL, no writes, no downloads.

    Queries: rejections, recoveries, candidate_events (?id=), ready_at (?time=ISO; a time
    that does not parse is a query error, HTTP 400), chain_head, seals. Needs the `ui`
    extra: pip install 'lifecycle-fsm[ui]'.
    """
    from lifecycle_fsm.replay.browse import metadata, snapshot

    try:
        from datasette.cli import cli as datasette_cli
        from datasette.plugins import pm
        from datasette.utils import tilde_encode
    except ImportError:
        raise InputError("serve needs Datasette: pip install 'lifecycle-fsm[ui]'") from None
    from lifecycle_fsm.cli import serve_plugin

    if not pm.is_registered(serve_plugin):
        pm.register(serve_plugin, name="lifecycle_fsm")
    db = str(root_obj()["db"])
    if db.startswith(("postgresql://", "postgres://")):
        raise InputError("serve browses a SQLite ledger file: copy this one first (`lifecycle migrate URL FILE.db`)")
    ledger = Path(db)
    if not ledger.is_file():
        raise InputError(f"no ledger at {ledger} (serve browses an existing SQLite ledger file)")
    port = _usable_port(host, port)
    with tempfile.TemporaryDirectory(prefix="lifecycle-serve-") as folder:
        snap = snapshot(ledger, Path(folder))
        meta = Path(folder) / "metadata.json"
        meta.write_bytes(orjson.dumps(metadata(snap), option=orjson.OPT_INDENT_2))
        # Datasette's own path for the database: a stem with a space, a dot or a non-ASCII letter is tilde-encoded
        # (`a b.v2` -> `a+b~2Ev2`); printed as written, it was a 404. An IPv6 host goes in brackets.
        where = f"[{host}]" if ":" in host else host
        click.echo(
            f"serving {ledger} as of seq {snap.head_seq} at http://{where}:{port}/{tilde_encode(snap.name)}", err=True
        )
        args = [
            "serve",
            "-i",
            str(snap.path),
            "-m",
            str(meta),
            "--host",
            host,
            "--port",
            str(port),
            "--setting",
            "default_allow_sql",
            "off",
            "--setting",
            "allow_download",
            "off",
            "--setting",
            "allow_csv_stream",
            "off",
        ]
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            datasette_cli.main(args=args, prog_name="lifecycle serve", standalone_mode=False)
        except _Stopped:
            click.echo("stopped", err=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
