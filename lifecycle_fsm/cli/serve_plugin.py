"""The Datasette plugin behind `lifecycle serve`: a read-only, local-only browser, and the CLI's time parsing in SQL.

Every request is judged before Datasette sees it: not GET or HEAD is 405 (Datasette would run a
POSTed canned query's SELECT, then answer 500); a Host that is not the server's is 421 (against DNS
rebinding); Datasette's pages about the server under `/-/` are 404 (its static files are served); a
`ready_at` time that does not parse gets its reason in place of SQLite's "user-defined function
raised exception". `lifecycle_utc` brings `:time` to the stored UTC text as `status --as-of` does.
"""

from __future__ import annotations

import html
import ipaddress
import sqlite3
import urllib.parse
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar, cast

import orjson
from datasette import hookimpl as datasette_hookimpl

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.log import parse_time

__all__ = ["ServePlugin", "allowed_hosts", "lifecycle_utc", "quiet_refused_times", "time_problem"]

_ASGIApp = Callable[[JSON, Any, Any], Awaitable[None]]
_SERVED_INTERNALS = ("/-/static/", "/-/static-plugins/")  # the CSS and scripts the pages load
_SQLITE_UDF_ERROR = "user-defined function raised exception"
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_F = TypeVar("_F", bound=Callable[..., Any])


def _hookimpl(func: _F) -> _F:
    """Datasette's (untyped) hook marker, keeping the function's type."""
    return cast(_F, datasette_hookimpl(func))


def lifecycle_utc(text: object) -> str | None:
    """An ISO 8601 time as stored UTC text; NULL for no time (NULL, or blank: the form before a time is typed)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        raise InputError(f":time must be an ISO 8601 time, not {type(text).__name__}")
    return parse_time(text)


def quiet_refused_times(hook: Callable[[Any], object]) -> Callable[[Any], object]:
    """`sys.unraisablehook`, but silent on the time `lifecycle_utc` refused: Datasette has SQLite print a
    traceback for every exception in an SQL function, and this one is the page's answer, not a fault."""

    def unraisable(info: Any) -> object:
        if info.object is lifecycle_utc and isinstance(info.exc_value, InputError):
            return None
        return hook(info)

    return unraisable


def time_problem(path: str, query_string: bytes) -> str | None:
    """What is wrong with the `time` of a `ready_at` request, or None (another page, or a good time)."""
    if path.rsplit("/", 1)[-1] not in ("ready_at", "ready_at.json"):
        return None
    for value in urllib.parse.parse_qs(query_string.decode("latin-1")).get("time", []):
        try:
            lifecycle_utc(value)
        except InputError as e:
            return f"time: {e}"
    return None


def allowed_hosts(host: str, extra: Collection[str] = ()) -> frozenset[str] | None:
    """The Host names the server answers to when bound to `host`; None: any IP address (a wildcard bind)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        name, loopback = host.lower(), host.lower() == "localhost"
    else:
        if address.is_unspecified:
            return None
        name, loopback = str(address), address.is_loopback
    names = {name, *(extra_name.lower() for extra_name in extra)}
    return frozenset(names | set(_LOOPBACK_NAMES)) if loopback else frozenset(names)


def _host_of(scope: JSON) -> str:
    """The Host header's name, without its port or IPv6 brackets ("" when there is none)."""
    header = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"host"), "")
    return (urllib.parse.urlsplit(f"//{header}").hostname or "").lower()


def _host_allowed(name: str, allowed: frozenset[str] | None) -> bool:
    if allowed is not None:
        return name in allowed
    try:  # a wildcard bind: an address typed by whoever opened it; a name could be anyone's (rebinding)
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


async def _answer(send: Any, status: int, text: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    start_headers = [(b"content-type", b"text/plain; charset=utf-8"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": text.encode()})


def _rewriting(send: Any, problem: str, as_json: bool) -> Callable[[JSON], Awaitable[None]]:
    """`send`, with SQLite's message for a failed function replaced by `problem` in the response body."""
    escaped = orjson.dumps(problem).decode()[1:-1] if as_json else html.escape(problem)
    started: JSON = {}
    parts: list[bytes] = []

    async def rewrite(message: JSON) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        parts.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = b"".join(parts).replace(_SQLITE_UDF_ERROR.encode(), escaped.encode())
        headers = [(k, v) for k, v in started.get("headers", ()) if k.lower() != b"content-length"]
        await send({**started, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return rewrite


class ServePlugin:
    """The hooks, bound to the names this server answers to (`allowed_hosts`)."""

    __name__ = "lifecycle_fsm.cli"  # Datasette names its plugins by module; this one lives here

    def __init__(self, hosts: frozenset[str] | None) -> None:
        self.hosts = hosts

    @_hookimpl
    def prepare_connection(self, conn: sqlite3.Connection) -> None:
        conn.create_function("lifecycle_utc", 1, lifecycle_utc, deterministic=True)

    @_hookimpl
    def asgi_wrapper(self) -> Callable[[_ASGIApp], _ASGIApp]:
        return self._wrap

    def _wrap(self, app: _ASGIApp) -> _ASGIApp:
        async def guarded(scope: JSON, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            path = scope.get("path", "")
            if scope["method"] not in ("GET", "HEAD"):
                await _answer(send, 405, "read-only: only GET and HEAD are served\n", ((b"allow", b"GET, HEAD"),))
            elif not _host_allowed(host := _host_of(scope), self.hosts):
                names = "any IP address" if self.hosts is None else ", ".join(sorted(self.hosts))
                why = f"this server answers only to {names}, not to the host {host or '(none)'!r}"
                await _answer(send, 421, f"{why} (serve --allow-host NAME adds a name)\n")
            elif path.startswith("/-/") and not path.startswith(_SERVED_INTERNALS):  # pages about the server
                await _answer(send, 404, "not served\n")
            elif (problem := time_problem(path, scope.get("query_string", b""))) is not None:
                await app(scope, receive, _rewriting(send, problem, path.endswith(".json")))
            else:
                await app(scope, receive, send)

        return guarded
