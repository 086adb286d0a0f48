"""A whole write transaction in one round trip: libpq's pipeline mode, prepared statements, text values.

Why it is built this way (measured: benchmarks/README.md, "PostgreSQL: the pipelined append"):
- The statements go as Bind/Execute messages of statements this session prepared,
  then one Sync. The server runs them as one implicit transaction and commits it at the
  Sync (rolls it back if any fails), so when the Sync's answer arrives the commit, and
  with `synchronous_commit=on` its WAL flush, is done. The same statements as one
  simple-query message (`BEGIN; SELECT lock; EXECUTE stmt('…', …); NOTIFY; COMMIT`)
  cost the server 517k instructions an append against 374k (callgrind): lexing the
  literals and evaluating EXECUTE's arguments as expressions.
- Each statement is still a statement of its own, so the insert after the lock reads a
  snapshot taken after the lock was granted (read committed): the lock cannot go into
  the insert itself.
- A statement is Parsed under a name in the same round trip the first time the session
  sends it (no extra trip, even for a one-command process); later appends Bind it
  and reuse its generic plan.
- Values are sent as text in the statement's parameter types, so nothing is quoted: a
  str as its bytes (NUL refused: PostgreSQL text cannot hold it), an int as its digits,
  a list as an array literal. Results come back as text and are decoded per column.
- libpq is driven through `psycopg.pq`, psycopg's `generators` and its wait loop (Ctrl-C
  still cancels the query), and the few columns read back are decoded here: psycopg's
  cursors and its Pipeline object add Python work per statement and per result (its
  Pipeline measured 4x slower than one message). Client instructions an append went
  from 425k to 249k (callgrind; raw psycopg INSERT+COMMIT: 192k).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators
from psycopg.pq import ExecStatus, TransactionStatus

from lifecycle_fsm.store.errors import InputError

if TYPE_CHECKING:
    from psycopg.pq.abc import PGresult

    from lifecycle_fsm.store.postgres_schema import PgSession

__all__ = ["COMMIT_UNKNOWN", "EVENT_ROW", "NOTHING_COMMITTED", "Pipeline", "decode_rows"]

# What a connection lost during a write means (`PgSession.fail`): lost before COMMIT was sent, nothing
# was committed; lost once it was (an explicit COMMIT, the pipeline's Sync), the outcome is unknown.
NOTHING_COMMITTED = "nothing of this transaction was committed"
COMMIT_UNKNOWN = (
    "whether it committed is unknown: repeat the command with the same event_id (a retry appends nothing twice)"
)

_MAX_NAMED = 64  # statement shapes (rows per insert, checks) prepared per connection
_TEXT = bytes.decode  # the session's client_encoding is UTF8 (`PgSession`)
# Column decoders of an `events` row (`EVENT_COLUMNS` order).
EVENT_ROW: tuple[Callable[[bytes], Any], ...] = (int, _TEXT, int, _TEXT, _TEXT, int, _TEXT, _TEXT, _TEXT, _TEXT, _TEXT)


def decode_rows(result: PGresult, columns: Sequence[Callable[[bytes], Any]]) -> list[tuple[Any, ...]]:
    """The rows of a text-format result, each column through its decoder (NULL stays None)."""
    get = result.get_value
    rows = []
    for r in range(result.ntuples):
        row = []
        for c, decode in enumerate(columns):
            value = get(r, c)
            row.append(None if value is None else decode(value))
        rows.append(tuple(row))
    return rows


class Pipeline:
    """The pipelined statements of one session (see the module docstring)."""

    def __init__(self, session: PgSession) -> None:
        self._session = session
        self._names: dict[str, bytes] = {}  # statement text (with %s) -> its prepared name
        # Names are never reused: after an interrupted exchange a Parse may or may not have
        # happened on the server, so a statement is prepared again under a new name.
        self._serial = itertools.count()
        self._numbered: dict[str, bytes] = {}  # statement text (with %s) -> the text with $1, $2, …
        self.supported = psycopg.Pipeline.is_supported()  # libpq >= 14 (psycopg's binary wheels bundle one)

    def forget(self) -> None:
        """A new connection (`PgSession.recover`) has none of this one's prepared statements."""
        self._names.clear()

    def _text(self, sql: str) -> bytes:
        numbered = self._numbered.get(sql)
        if numbered is None:
            numbers = itertools.count(1)
            numbered = self._numbered[sql] = re.sub("%s", lambda _: f"${next(numbers)}", sql).encode()
        return numbered

    def param(self, value: Any) -> bytes | None:
        """`value` as the text PostgreSQL's input function for the parameter's type reads."""
        if isinstance(value, str):  # a subclass (a StrEnum id, say) is sent as its text, as psycopg does
            text = str.__str__(value)
            if "\0" in text:  # the text input would stop at the NUL: refuse, never truncate
                raise InputError(f"{self._session.where}: the database cannot store this value (text containing NUL)")
            return text.encode()  # the session's client_encoding is UTF8 (`PgSession`)
        if isinstance(value, int) and not isinstance(value, bool):
            return int.__repr__(value).encode()
        if value is None:
            return None
        if isinstance(value, list):
            return self.param("{" + ",".join(map(_array_element, value)) + "}")
        raise InputError(f"{self._session.where}: cannot send a {type(value).__name__} to the database")

    def _name(self, sql: str) -> bytes | None:
        """The name to prepare `sql` under when it is new (None: known already, or too many shapes)."""
        if sql in self._names or len(self._names) >= _MAX_NAMED:
            return None
        name = self._names[sql] = b"lifecycle_pipe_%d" % next(self._serial)
        return name

    def run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[PGresult]:
        """Run `statements` (text with %s or $n, values) as one transaction in one round trip; their results.

        Raises the project error for the first statement that failed (psycopg's error is the
        cause); then nothing was committed.
        """
        if not self.supported:
            return self._one_message(statements)
        session = self._session
        conn = session.conn
        pg = conn.pgconn
        bound = [[self.param(v) for v in params] for _, params in statements]
        fresh: list[str] = []
        with session.mapped("write transaction failed", lost=COMMIT_UNKNOWN):
            try:  # pipeline mode is entered inside: an interrupt at any point leaves it (`_leave_pipeline`)
                pg.enter_pipeline_mode()
                for sql, _ in statements:
                    name = self._name(sql)
                    if name is not None:
                        fresh.append(sql)
                        pg.send_prepare(name, self._text(sql))
                for (sql, _), values in zip(statements, bound, strict=True):
                    name = self._names.get(sql)
                    if name is None:
                        pg.send_query_params(self._text(sql), values)
                    else:
                        pg.send_query_prepared(name, values)
                pg.pipeline_sync()
                results: list[PGresult] = conn.wait(_exchange(pg, len(fresh) + len(statements)))
            except BaseException:
                for sql in fresh:  # not known to exist: prepare again next time
                    self._names.pop(sql, None)
                raise
            finally:
                _leave_pipeline(conn)
            prepared, results = results[: len(fresh)], results[len(fresh) :]
            for sql, result in zip(fresh, prepared, strict=True):
                if result.status != ExecStatus.COMMAND_OK:
                    self._names.pop(sql, None)  # its Parse failed: the name does not exist
            for result in (*prepared, *results):
                if result.status == ExecStatus.FATAL_ERROR:
                    raise pg_errors.error_from_result(result)
        return results

    def _one_message(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[PGresult]:
        """Without pipeline mode (an older libpq): the statements as one simple-query message, values
        bound client-side (`PgSession.inline`); the server runs it as one implicit transaction,
        rolled back whole if a statement fails. Still one round trip, each statement planned anew."""
        session = self._session
        conn = session.conn
        with session.mapped("write transaction failed", lost=COMMIT_UNKNOWN):
            text = "; ".join(session.inline(*_percent(sql, params)) for sql, params in statements)
            try:
                conn.pgconn.send_query(text.encode())
                results: list[PGresult] = conn.wait(generators.execute(conn.pgconn))
            except BaseException:
                if conn.pgconn.transaction_status == TransactionStatus.ACTIVE:
                    conn.close()  # answers left unread (interrupted): as `_leave_pipeline`
                raise
            for result in results:
                if result.status == ExecStatus.FATAL_ERROR:
                    raise pg_errors.error_from_result(result)
        return results


def _percent(sql: str, params: Sequence[Any]) -> tuple[str, list[Any]]:
    """`sql` with `$n` parameters as `%s` ones, and the values in the order they now appear."""
    order = [int(n) - 1 for n in re.findall(r"\$(\d+)", sql)]
    if not order:
        return sql, list(params)
    return re.sub(r"\$\d+", "%s", sql), [params[i] for i in order]


def _array_element(value: Any) -> str:
    if isinstance(value, str):
        text = str.__str__(value)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None:
        return "NULL"
    return int.__repr__(int(value))


def _exchange(pg: Any, commands: int) -> Any:
    """psycopg's generators: flush what was queued, then each command's result and the Sync's."""
    yield from generators.send(pg)
    results: list[PGresult] = []
    for _ in range(commands):
        got = yield from generators.fetch_many(pg)
        results.append(got[0])  # one result per command (an aborted one: PIPELINE_ABORTED)
    got = yield from generators.fetch_many(pg)
    if [r.status for r in got] != [ExecStatus.PIPELINE_SYNC]:  # a psycopg whose generators answer otherwise
        raise psycopg.OperationalError(f"unexpected answer to the pipeline's Sync: {[r.status for r in got]}")
    return results


def _leave_pipeline(conn: psycopg.Connection[Any]) -> None:
    """Back to normal mode; a session with unread results (interrupted) is closed, the server rolls back."""
    try:
        conn.pgconn.exit_pipeline_mode()
    except psycopg.Error:
        conn.close()
