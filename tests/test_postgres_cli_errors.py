"""What a user sees when PostgreSQL cannot serve the ledger: real servers, the command line run in this
process (click's runner), and real `lifecycle` processes where the process is the point (the installed
command reading `--db` and `LIFECYCLE_DB`, a writer waiting on a lock held by another session).

Every case is exit 7 (the store failed), one `Error:` line on stderr, no traceback, and
the URL's password nowhere in stdout or stderr, with debug logs on. The stuck-writer
case holds the ledger's advisory lock from a plain psycopg connection inside an open
transaction, as a hung writer would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from backends import pg_execute
from click.testing import CliRunner
from conftest import Workspace, cli, run_cli

from lifecycle_fsm import InputError, Ledger
from lifecycle_fsm.cli import main
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.postgres_schema import STORE_SCHEMA_VERSION

pytestmark = pytest.mark.postgres

SECRET = "s3cret-pw"


def with_password(url: str) -> str:
    """`url` with a password in its user part (trust auth ignores it; it must never be shown)."""
    assert "://postgres@" in url, "LIFECYCLE_TEST_PG must connect as user postgres for this test"
    return url.replace("://postgres@", f"://postgres:{SECRET}@", 1)


def assert_one_error_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert SECRET not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _foreign_events_table(url: str) -> None:
    pg_execute(url, "CREATE TABLE events (id int)")


def _other_schema_version(url: str) -> None:
    PostgresEventStore(url).close()
    pg_execute(url, "UPDATE meta SET value = %s", (str(STORE_SCHEMA_VERSION + 1),))


UNUSABLE = {
    "refused": (f"postgresql://postgres:{SECRET}@127.0.0.1:1/test", "Connection refused"),
    "no-database": (
        f"postgres://postgres:{SECRET}@127.0.0.1:5432/no_such_db_here",
        'database "no_such_db_here" does not exist',
    ),
    "unparsable": (f"postgresql://postgres:{SECRET}@[::1:5432/test", "IPv6"),
    "bad-option": (
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test?no_such_option=1",
        "invalid URI query parameter",
    ),
    "password-parameter": (f"postgresql://127.0.0.1:1/test?password={SECRET}", "Connection refused"),
}


def _unusable(url: str, via: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    """`command` against `url` given by `--db` or by `LIFECYCLE_DB`, in this process."""
    if via == "--db":
        return cli(url, "--log-level", "debug", *command)
    result = CliRunner().invoke(
        main, ["--log-level", "debug", *command], env={"LIFECYCLE_DB": url}, catch_exceptions=False
    )
    return subprocess.CompletedProcess(command, result.exit_code, result.stdout, result.stderr)


@pytest.mark.parametrize(("url", "needle"), UNUSABLE.values(), ids=UNUSABLE)
@pytest.mark.parametrize("via", ["--db", "LIFECYCLE_DB"])
@pytest.mark.parametrize("command", [["init"], ["status"], ["--json", "verify"]], ids=lambda c: c[-1])
def test_unusable_server_is_exit_7_one_line_no_password(url: str, needle: str, via: str, command: list[str]) -> None:
    """A refused connection, a missing database, a malformed URL: exit 7, one line, the password redacted."""
    done = _unusable(url, via, command)
    assert_one_error_line(done, 7, needle)
    assert done.stderr.count("PostgreSQL URL") <= 1  # where it is said once, not again inside the driver's text


@pytest.mark.parametrize("via", ["--db", "LIFECYCLE_DB"])
def test_the_installed_command_exits_7_one_line_no_password(via: str) -> None:
    """The same through a real `lifecycle` process, the URL given either way: what the process exits with
    and writes to its stderr, debug logs on."""
    url, needle = UNUSABLE["refused"]
    if via == "--db":
        proc = run_cli(url, "--log-level", "debug", "status")
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "lifecycle_fsm", "--log-level", "debug", "status"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            env={**os.environ, "LIFECYCLE_DB": url},
        )
    assert_one_error_line(proc, 7, needle)


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [(_foreign_events_table, "is not a ledger"), (_other_schema_version, f"is not {STORE_SCHEMA_VERSION}")],
    ids=["foreign-events-table", "other-schema-version"],
)
@pytest.mark.parametrize("command", [["init"], ["status"]], ids=lambda c: c[-1])
def test_wrong_schema_is_exit_7(pg_url: str, spoil: Callable[[str], None], needle: str, command: list[str]) -> None:
    """A schema that holds something else than a ledger of this version is refused, writer or reader."""
    spoil(pg_url)
    assert_one_error_line(cli(with_password(pg_url), "--log-level", "debug", *command), 7, needle)


@pytest.fixture
def stuck_writer(pg_url: str, ws: Workspace) -> Iterator[tuple[str, int]]:
    """A ledger with one candidate, and a plain connection holding its write lock inside an open transaction."""
    proc = cli(pg_url, "init")
    assert proc.returncode == 0, proc.stderr
    with PostgresEventStore(pg_url) as store:
        key = store.session.lock_key
    locked, release = threading.Event(), threading.Event()
    pid: list[int] = []

    def hold() -> None:
        with psycopg.connect(pg_url, application_name="hung-supervisor") as conn:
            pid.append(conn.info.backend_pid)
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            locked.set()
            release.wait(120)
            conn.rollback()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        yield pg_url, pid[0]
    finally:
        release.set()
        holder.join()


def test_stuck_writer_is_exit_7_naming_the_holder(stuck_writer: tuple[str, int], ws: Workspace) -> None:
    """While another session holds the lock, a write waits lock_timeout (here set in the URL), then exit 7
    naming the holder's pid and application; nothing was appended, and reads still work meanwhile."""
    url, pid = stuck_writer
    impatient = with_password(url) + "%20-clock_timeout%3D300"  # inside the options= value: a second -c
    started = time.monotonic()
    proc = run_cli(impatient, "--log-level", "debug", "baseline", "activate", str(ws.baseline()))
    assert_one_error_line(
        proc,
        7,
        "write lock for more than 300ms (lock_timeout",
        f"server pid {pid}",
        "hung-supervisor",
        "nothing was appended",
    )
    assert time.monotonic() - started < 20
    assert pg_execute(url, "SELECT count(*) FROM events") == [(1,)]
    status = run_cli(url, "--json", "verify")  # readers take no lock
    assert status.returncode == 0, status.stderr


def test_default_timeouts_are_set_on_the_session(pg_url: str) -> None:
    """Without the URL saying otherwise, lock_timeout is busy_timeout and the idle timeout is set (never 0)."""
    with PostgresEventStore(pg_url, busy_timeout=0) as store:
        shown = store.session.conn.execute(
            "SELECT current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')"
        ).fetchone()
    assert shown == ("1ms", "1min")
    with PostgresEventStore(pg_url) as store:
        assert (store.session.lock_timeout, store.session.idle_timeout_shown) == ("30s", "1min")


@pytest.mark.parametrize("written", ["CliMixed", "Cli-Dash"], ids=["mixed-case", "dash"])
def test_a_new_schema_named_unquoted_in_mixed_case_is_created_as_postgres_reads_it(ws: Workspace, written: str) -> None:
    """`?options=-csearch_path=CliMixed` is the schema `climixed` to PostgreSQL (an unquoted name is folded to
    lower case), but `init` created `"CliMixed"` and then failed "cannot create the ledger schema (no schema has
    been selected to create in)", exit 7. It creates the schema the search_path names, as PostgreSQL folds it."""
    from backends import PG_BASE, require_postgres, with_schema

    require_postgres()
    suffix = os.urandom(4).hex()
    written = f"{written}_{suffix}"
    folded = written.lower()
    url = with_schema(PG_BASE, written)
    try:
        done = cli(url, "init")
        assert done.returncode == 0, done.stderr
        assert pg_execute(PG_BASE, "SELECT nspname FROM pg_namespace WHERE lower(nspname) = %s", (folded,)) == [
            (folded,)
        ]
        again = cli(url, "--json", "status")
        assert again.returncode == 0 and again.stdout.strip() == "[]", again.stderr
    finally:
        for name in (written, folded):
            pg_execute(PG_BASE, f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.parametrize("via", ["api", "cli"])
@pytest.mark.parametrize("first", ["host=127.0.0.1", "connect_timeout=10 host=127.0.0.1", " application_name = x"])
def test_a_libpq_keyword_string_is_refused_not_taken_for_a_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str, first: str
) -> None:
    """`host=... dbname=...` is libpq's other spelling: opened as a path it made an SQLite file named
    with the password, and a supervisor wrote to a private ledger without a word."""
    monkeypatch.chdir(tmp_path)
    conninfo = f"{first} user=postgres password=S3cretPW dbname=nodb"
    if via == "api":
        with pytest.raises(InputError, match="postgresql://") as info:
            Ledger.open(conninfo)
        message = str(info.value)
    else:
        result = cli(conninfo, "init")
        assert result.returncode == 3 and result.stderr.count("\n") == 1, result.stderr
        message = result.stderr
    assert "S3cretPW" not in message
    assert list(tmp_path.iterdir()) == []


def test_a_file_whose_name_only_looks_like_libpq_keywords_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only libpq's own keywords make a conninfo, and a path that exists is always the file it names."""
    monkeypatch.chdir(tmp_path)
    assert cli("run=1.db", "init").returncode == 0 and (tmp_path / "run=1.db").is_file()
    assert cli("./host=x.db", "init").returncode == 0
    assert cli("host=x.db", "verify").returncode == 0  # it exists: the file, not a server
