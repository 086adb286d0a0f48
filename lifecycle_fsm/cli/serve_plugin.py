"""A Datasette plugin for `lifecycle serve`: read-only methods, and the CLI's own time parsing in SQL.

Every request that is not GET or HEAD is answered 405 before Datasette sees it: the
browser has nothing to write, and Datasette 0.65.5 answers a POST to a read-only
canned query with a 500 after running its SELECT.

`ready_at` compares the stored UTC text with `:time`; SQLite's date functions round to
the millisecond, so `:time` is brought to the stored form by `replay.asof.parse_time`,
exactly as `status --as-of` does. Text that is not a time raises inside the function, so
the query fails and Datasette answers its error (HTTP 400, `"ok": false`) instead of an
empty list that reads as "nothing was ready then"; a blank `:time` (the query's form
before a time is typed: Datasette binds a missing parameter as "") is NULL and matches
nothing. Imported and registered only when `serve` runs, so the CLI never imports
Datasette otherwise.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from datasette import hookimpl as datasette_hookimpl

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.replay.asof import parse_time

__all__ = ["asgi_wrapper", "lifecycle_utc", "prepare_connection"]

_ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
_F = TypeVar("_F", bound=Callable[..., Any])


def _hookimpl(func: _F) -> _F:
    """Datasette's (untyped) hook marker, keeping the function's type."""
    return cast(_F, datasette_hookimpl(func))


def lifecycle_utc(text: object) -> str | None:
    """An ISO 8601 time as stored UTC text; NULL for no time (NULL or blank).

    Anything else raises (`InputError`): SQLite fails the query with "user-defined function
    raised exception" (Python's sqlite3 lets a function choose no message of its own) and
    Datasette answers that as a query error, HTTP 400.
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        raise InputError(f":time must be an ISO 8601 time, not {type(text).__name__}")
    return parse_time(text)


@_hookimpl
def prepare_connection(conn: sqlite3.Connection) -> None:
    conn.create_function("lifecycle_utc", 1, lifecycle_utc, deterministic=True)


@_hookimpl
def asgi_wrapper() -> Callable[[_ASGIApp], _ASGIApp]:
    def wrap(app: _ASGIApp) -> _ASGIApp:
        async def read_only(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 405,
                        "headers": [(b"allow", b"GET, HEAD"), (b"content-type", b"text/plain")],
                    }
                )
                await send({"type": "http.response.body", "body": b"read-only: only GET and HEAD are served\n"})
                return
            await app(scope, receive, send)

        return read_only

    return wrap
