"""Choosing a backend from what the user named, a file path or a PostgreSQL URL, the same everywhere.

It imports no driver: psycopg (the optional `postgres` extra) is loaded only for a URL."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lifecycle_fsm.errors import InputError, StoreError

if TYPE_CHECKING:
    from lifecycle_fsm.store.base import EventStore

_URL_SCHEMES = ("postgresql://", "postgres://")
# libpq's `keyword=value ...` spelling, taken for a file name, would make an SQLite ledger named after it.
_LIBPQ_KEYWORDS = (
    "host|hostaddr|port|dbname|user|password|passfile|require_auth|channel_binding|connect_timeout|"
    "client_encoding|options|application_name|fallback_application_name|keepalives|keepalives_idle|"
    "keepalives_interval|keepalives_count|tcp_user_timeout|replication|gssencmode|sslmode|requiressl|"
    "sslcompression|sslcert|sslkey|sslpassword|sslcertmode|sslrootcert|sslcrl|sslcrldir|sslsni|requirepeer|"
    "ssl_min_protocol_version|ssl_max_protocol_version|krbsrvname|gsslib|gssdelegation|service|"
    "target_session_attrs|load_balance_hosts"
)
_KEYWORD_CONNINFO = re.compile(rf"\s*({_LIBPQ_KEYWORDS})\s*=")
# Both backends keep the wait in milliseconds in a C int (SQLite's busy_timeout, PostgreSQL's lock_timeout).
_MAX_BUSY_TIMEOUT = (2**31 - 1) / 1000


def busy_timeout_seconds(value: object, name: str = "busy_timeout") -> float:
    """A finite number of seconds from 0 to `_MAX_BUSY_TIMEOUT`; else an InputError naming the option."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InputError(f"{name} must be a number of seconds, not {value!r}")
    if not (0 <= value <= _MAX_BUSY_TIMEOUT) or (isinstance(value, float) and not math.isfinite(value)):
        raise InputError(f"{name} must be a finite number of seconds from 0 to {_MAX_BUSY_TIMEOUT}, not {value!r}")
    return float(value)


def synchronous_mode(value: object, modes: Collection[str]) -> str:
    """`value` upper-cased when it is one of `modes` (case-insensitive); else an InputError."""
    mode = value.upper() if isinstance(value, str) else None
    if mode is None or mode not in modes:
        raise InputError(f"synchronous must be one of {', '.join(modes)}, not {value!r}")
    return mode


def is_postgres_url(target: object) -> bool:
    """Whether `--db` / `Ledger.open` names a PostgreSQL server rather than a file."""
    return isinstance(target, str) and target.lower().startswith(_URL_SCHEMES)


def redact_url(url: str) -> str:
    """The URL without its password (in the user part or a `password=` parameter), for messages."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostinfo = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostinfo}" if ":" in userinfo else f"{user}@{hostinfo}"
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="=%-*")
        shown = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
        if not netloc:  # `postgresql:///db?host=/run/postgresql`: urlunsplit drops the `//`, leaving a file name
            rest = shown[len(parts.scheme) + 1 :]
            shown = shown if rest.startswith("//") else f"{parts.scheme}://{rest}"
        return shown
    except ValueError:
        return "the PostgreSQL URL (unparsable)"


def describe_target(target: str | os.PathLike[str]) -> str:
    """How messages name a ledger: the path, or the URL without its password."""
    return redact_url(str(target)) if is_postgres_url(target) else os.fspath(target)


def open_store(
    target: str | os.PathLike[str],
    *,
    synchronous: str = "FULL",
    busy_timeout: float = 30.0,
    create: bool = True,
) -> EventStore:
    """The event store `target` names: `postgresql://…` / `postgres://…` or an SQLite file; `create=False`
    refuses (InputError) one that does not exist yet (a read never initialises a database)."""
    if is_postgres_url(target):
        try:
            from lifecycle_fsm.store.postgres import PostgresEventStore
        except ImportError as e:
            raise StoreError(
                f"{redact_url(str(target))}: PostgreSQL needs psycopg: pip install 'lifecycle-fsm[postgres]' ({e})"
            ) from e
        return PostgresEventStore(str(target), synchronous=synchronous, busy_timeout=busy_timeout, create=create)
    from lifecycle_fsm.store.sqlite import SQLiteEventStore

    path = os.fspath(target)
    if isinstance(path, str) and _KEYWORD_CONNINFO.match(path) and not os.path.lexists(path):
        raise InputError(
            "the ledger is named as libpq keywords (host=... dbname=...): give a postgresql:// URL, e.g. "
            "postgresql://USER@HOST:5432/DBNAME (or ./NAME for a file whose name starts so)"
        )
    if not create and path != ":memory:" and not os.path.exists(path):
        raise InputError(f"no ledger at {path} (create one with `lifecycle init`, or name one: --db, LIFECYCLE_DB)")
    return SQLiteEventStore(path, synchronous=synchronous, busy_timeout=busy_timeout, create=create)
