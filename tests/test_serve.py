"""`lifecycle serve` for real: a subprocess on a free loopback port, its canned queries, its refusals, a browser.

Datasette (extra `ui`) and Chromium (Debian's `chromium`) are needed; without them the
tests skip locally and fail in CI (`CI=true`), where `.ci/run` installs both.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from auditor_cases import auditor_ledger
from browser import Chromium
from conftest import REPO, Workspace

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import verify
from lifecycle_fsm.replay.browse import CANNED_QUERIES
from lifecycle_fsm.replay.explain import explain
from lifecycle_fsm.store.base import event_at
from lifecycle_fsm.store.sqlite import SQLiteEventStore

CHROMIUM = Path("/usr/bin/chromium")
# Datasette's pages about the server itself (its versions, plugins, settings, threads, databases' paths).
INTROSPECTION = (
    "/-/threads",
    "/-/databases",
    "/-/versions",
    "/-/plugins",
    "/-/settings",
    "/-/config",
    "/-/metadata",
    "/-/actor",
    "/-/messages",
    "/-/allow-debug",
    "/-/patterns",
    "/-/permissions",
)
ARTIFACTS = REPO / "test-artifacts"


def _need(available: bool, what: str) -> None:
    if not available:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is missing in CI (.ci/run installs it)")
        pytest.skip(f"{what} is not installed")


def _one_event_ledger(tmp_path: Path, name: str | None = None) -> Workspace:
    """A workspace whose ledger (`name` in `tmp_path`, else the default) holds its `init`; Datasette required."""
    try:
        import datasette  # noqa: F401
    except ImportError:
        _need(False, "Datasette (pip install -e '.[ui]')")
    ws = Workspace(tmp_path)
    if name is not None:
        ws.db = tmp_path / name
    with Ledger.open(ws.db, actor="t") as ledger:
        ledger.init()
    return ws


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A running `lifecycle serve` subprocess and how to reach it."""

    def __init__(self, ws: Workspace, tmpdir: Path, *, prefix: tuple[str, ...] = ()) -> None:
        self.port = _free_port()
        self.tmpdir = tmpdir
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        argv = [*prefix, sys.executable, "-m", "lifecycle_fsm", "--db", str(ws.db), "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/.json")
                return
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise AssertionError(f"serve did not start: {self.proc.communicate()}") from None
                time.sleep(0.2)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:  # Datasette's query errors are JSON documents too
                return e.code, json.loads(e.read())
            except ValueError:
                return e.code, None

    def page(self, path: str, host: str | None = None) -> tuple[int, str]:
        """An HTML page's status and text (`host`: the Host header to send instead of the address)."""
        request = urllib.request.Request(self.url(path), headers={"Host": host} if host else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, data: dict[str, str]) -> int:
        request = urllib.request.Request(self.url(path), data=urllib.parse.urlencode(data).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def query(self, name: str, **params: str) -> list[dict[str, Any]]:
        status, rows = self.get(f"/ledger/{name}.json?" + urllib.parse.urlencode({"_shape": "array", **params}))
        assert status == 200, (name, status)
        return rows  # type: ignore[no-any-return]

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workspace, dict[str, str], Server]]:
    try:
        import datasette  # noqa: F401
    except ImportError:
        _need(False, "Datasette (pip install -e '.[ui]')")
    ws = Workspace(tmp_path_factory.mktemp("served"))
    states = auditor_ledger(ws)
    server = Server(ws, tmp_path_factory.mktemp("serve-tmp"))
    try:
        yield ws, states, server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()


def test_each_canned_query_answers_from_the_snapshot(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """The six canned queries agree with explain, history and verify on the same ledger."""
    ws, states, server = served
    store = SQLiteEventStore(ws.db, synchronous="NORMAL")
    try:
        rejected = sorted(cid for cid, s in states.items() if s == "reject")
        rows = server.query("rejections")
        assert sorted(r["id"] for r in rows) == rejected
        for row in rows:
            doc = explain(store, row["id"])
            assert (json.loads(row["reason_codes"]), row["seq"]) == (doc["reason_codes"], doc["decisive_event"]["seq"])
        recoveries = server.query("recoveries")
        assert {(r["id"], r["stage"], r["action"]) for r in recoveries} == {
            ("rlvr-rec", "sampling", "retry_sampling_from_prompt_queue"),
            ("grpo-block", "update", "block_update"),
        }
        events = server.query("candidate_events", id="dpo-good")
        assert [e["seq"] for e in events] == [e.seq for e in store.read_stream("candidate:dpo-good")]
        assert [e["type"] for e in events] == ["CandidateReceived", "ChecksRecorded", "HandoffDecided"]
        ready_seq = events[-1]["seq"]
        assert [r["id"] for r in server.query("ready_at", time="2099-01-01T00:00:00Z")] == ["dpo-good"]
        assert server.query("ready_at", time=events[0]["recorded_at"]) == []  # received, not yet ready
        assert [r["seq"] for r in server.query("ready_at", time=events[-1]["recorded_at"])] == [ready_seq]
        for garbage in ("not a time", "garbage", "-1"):  # an error, never `[]` ("nothing was ready then")
            query = urllib.parse.urlencode({"_shape": "array", "time": garbage})
            status, doc = server.get(f"/ledger/ready_at.json?{query}")
            assert status == 400 and doc["ok"] is False and doc["rows"] == [], (garbage, status, doc)
            assert doc["error"] == f"time: not an ISO 8601 time: {garbage!r} (e.g. 2026-11-30T12:00:00Z)"
        status, page = server.page("/ledger/ready_at?time=garbage")  # the HTML page says what is wrong too
        assert status == 400 and "time: not an ISO 8601 time: &#x27;garbage&#x27;" in page
        assert server.query("ready_at", time="") == server.query("ready_at") == []  # the blank form: no time yet
        offset = dt.datetime.fromisoformat(events[-1]["recorded_at"]).astimezone(dt.timezone(dt.timedelta(hours=-5)))
        assert [r["seq"] for r in server.query("ready_at", time=offset.isoformat())] == [ready_seq]  # same instant
        head = verify(store)["head"]
        recorded_at = event_at(store, head["seq"]).recorded_at  # type: ignore[union-attr]
        assert server.query("chain_head") == [{**head, "recorded_at": recorded_at, "events": head["seq"]}]
        assert server.query("seals") == []
        status, home = server.page("/")  # the title says which snapshot this is (the metadata page is not served)
        assert status == 200 and f"Ledger ledger: snapshot at seq {head['seq']}" in html.unescape(home)
        status, database = server.get("/ledger.json")
        assert status == 200 and {q["name"] for q in database["queries"]} >= {"rejections", "ready_at", "seals"}
    finally:
        store.close()


def test_sql_writes_and_downloads_are_refused(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """Arbitrary SQL, `_where`, a POST and the database download are refused; the live file keeps taking writes."""
    ws, _, server = served
    head = server.query("chain_head")[0]
    assert server.get("/ledger.json?sql=" + urllib.parse.quote("select * from events"))[0] == 403
    assert server.get("/ledger/events.json?_where=" + urllib.parse.quote("seq > 0"))[0] == 403
    assert server.post("/ledger/rejections", {"id": "x"}) == 405
    assert server.post("/ledger", {"sql": "DELETE FROM events"}) == 405
    assert server.get("/ledger.db")[0] == 403
    with Ledger.open(ws.db, synchronous="NORMAL") as led:  # the live ledger is not locked by the browser
        led.advance_window(9)
    assert server.query("chain_head")[0] == head  # the snapshot does not move


def test_pages_offer_the_queries_and_no_sql(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """The home page lists every canned query with a link; a query's page has no SQL editor and no Run SQL or
    Format SQL button (SQL is refused), only a form for its own parameters."""
    _, _, server = served
    status, home = server.page("/")
    assert status == 200
    for name, query in CANNED_QUERIES.items():
        assert f'<a href="/ledger/{name}">{html.escape(query["title"])}</a>' in home
    for name in CANNED_QUERIES:
        status, page = server.page(f"/ledger/{name}")
        assert status == 200, name
        assert not re.search(r"<textarea|Run SQL|Format SQL|Custom SQL query|Edit SQL", page), name
        form = re.search(r'<form class="canned-query".*?</form>', page, re.S)
        assert (form is not None) == bool(CANNED_QUERIES[name].get("params")), name


def test_only_its_own_host_names_and_no_server_internals(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """A Host header of another name (a page elsewhere, rebound to 127.0.0.1) is refused (421); localhost and the
    address are answered; /-/threads and /-/databases are not served; the snapshot is the owner's alone (0600)."""
    _, _, server = served
    assert server.page("/", host="attacker.example")[0] == 421
    assert server.page("/ledger/rejections.json", host=f"attacker.example:{server.port}")[0] == 421
    assert server.page("/", host=f"localhost:{server.port}")[0] == 200
    assert server.page("/", host=f"127.0.0.1:{server.port}")[0] == 200
    for path in (*INTROSPECTION, "/-/threads.json", "/-/databases.json", "/-/versions.json", "/-/anything"):
        assert server.page(path)[0] == 404, path
    assert server.page("/-/static/app.css")[0] == 200  # what the pages themselves load
    [snapshot] = server.tmpdir.glob("lifecycle-serve-*/*.db")
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert stat.S_IMODE(snapshot.parent.stat().st_mode) == 0o700


def test_the_hosts_a_server_answers_to() -> None:
    """Loopback: its address and localhost; a name: that name; a wildcard: any IP address; plus --allow-host."""
    from lifecycle_fsm.cli.serve_plugin import allowed_hosts

    assert allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("::1", ["Ledger.Internal"]) == {"::1", "127.0.0.1", "localhost", "ledger.internal"}
    assert allowed_hosts("10.0.0.5") == {"10.0.0.5"}
    assert allowed_hosts("box.example") == {"box.example"}
    assert allowed_hosts("LocalHost") == {"127.0.0.1", "localhost", "::1"}  # a loopback name: every loopback name
    assert allowed_hosts("0.0.0.0") is None


@pytest.mark.slow
def test_a_browser_finds_a_rejected_id_on_the_rejections_page(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """Headless Chromium loads the rejections page; a rejected id is on it; the screenshot is kept as an artifact."""
    _need(CHROMIUM.exists(), "Chromium (apt-get install chromium)")
    _, states, server = served
    ARTIFACTS.mkdir(exist_ok=True)
    profile = server.tmpdir / "chromium-profile"
    with Chromium(profile) as browser:
        home = browser.open(server.url("/"))
        links = home.evaluate("Array.from(document.querySelectorAll('.metadata-description a')).map((a) => a.href)")
        assert links == [server.url(f"/ledger/{name}") for name in CANNED_QUERIES]
        page = browser.open(server.url("/ledger/rejections"))
        text = page.evaluate("document.body.innerText")
        assert "Rejected candidates" in text and "dpo-good" not in text
        assert all(cid in text for cid, s in states.items() if s == "reject")
        assert page.evaluate("document.querySelectorAll('textarea, button, input[type=submit]').length") == 0
        ready = browser.open(server.url("/ledger/ready_at"))
        ready.evaluate("document.querySelector('#qp1').value = 'next tuesday'")
        ready.click("form.canned-query input[type=submit]")  # a real click: the form's GET loads the answer
        assert browser.wait_event("Page.loadEventFired", ready.session, timeout=60) is not None
        error = ready.evaluate("document.querySelector('.message-error').innerText")
        assert error == "time: not an ISO 8601 time: 'next tuesday' (e.g. 2026-11-30T12:00:00Z)"
    shot = ARTIFACTS / "serve-rejections.png"
    shot.unlink(missing_ok=True)
    flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}-shot"]
    argv = [*flags, "--window-size=1280,900", f"--screenshot={shot}", server.url("/ledger/rejections")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]


def test_stopping_the_server_removes_its_snapshot(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """SIGTERM ends the server cleanly (exit 0) and the snapshot folder goes with it; its log, refused
    times and requests included, holds no traceback."""
    _, _, server = served
    assert [p.name for p in server.tmpdir.iterdir() if p.name.startswith("lifecycle-serve-")]
    code, err = server.stop()
    assert code == 0 and "Traceback" not in err, err[-4000:]
    assert not [p for p in server.tmpdir.iterdir() if p.name.startswith("lifecycle-serve-")]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGHUP, signal.SIGKILL], ids=["SIGINT", "SIGHUP", "SIGKILL"])
def test_a_stopped_or_killed_server_leaves_no_readable_copy(tmp_path: Path, how: signal.Signals) -> None:
    """SIGINT (Ctrl-C) and SIGHUP (its terminal closed) remove the snapshot like SIGTERM; SIGKILL cannot,
    but what stays is the owner's alone."""
    server = Server(_one_event_ledger(tmp_path), tmp_path)
    server.proc.send_signal(how)
    _, err = server.proc.communicate(timeout=30)
    left = list(tmp_path.glob("lifecycle-serve-*"))
    if how != signal.SIGKILL:
        assert server.proc.returncode == 0 and left == [] and "Traceback" not in err, err[-2000:]
        return
    [folder] = left
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in folder.glob("*.db"))


def test_a_server_started_under_nohup_outlives_its_terminal(tmp_path: Path) -> None:
    """nohup ignores SIGHUP so that the server outlives the terminal: serve keeps it ignored."""
    server = Server(_one_event_ledger(tmp_path), tmp_path, prefix=("nohup",))
    try:
        server.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert server.proc.poll() is None and server.get("/.json")[0] == 200
    finally:
        code, _ = server.stop()
    assert code == 0 and not list(tmp_path.glob("lifecycle-serve-*"))


def test_the_printed_address_opens_for_a_ledger_whose_name_needs_encoding(tmp_path: Path) -> None:
    """serve printed `http://HOST:PORT/<stem>` as the stem is written: for `audit ledger ü.v2.db` a space, an
    `ü` and a dot Datasette reads as a format suffix. Opened in a browser (percent-encoded) it was redirected to
    a 404. The address printed is Datasette's own path for the database, and it answers."""
    ws = _one_event_ledger(tmp_path, "audit ledger ü.v2.db")
    server = Server(ws, tmp_path)
    try:
        assert server.proc.stderr is not None
        line = server.proc.stderr.readline()
        address = line.rsplit(" at ", 1)[1].strip()
        assert address.startswith(f"http://127.0.0.1:{server.port}/") and " " not in address, line
        path = urllib.parse.urlsplit(address).path
        status, rows = server.get(f"{path}/chain_head.json?_shape=array")
        assert status == 200 and rows[0]["seq"] == 1, (address, status, rows)
    finally:
        server.stop()


def test_a_port_in_use_is_one_error_line_before_anything_is_served(tmp_path: Path) -> None:
    """`serve --port P` with P taken printed "serving … at http://127.0.0.1:P/…", then Uvicorn's INFO lines and
    "ERROR: [Errno 98] … address already in use", and exited 3 with no `Error:` line. It is refused first:
    one line saying which address and what to do, nothing claimed to be served."""
    ws = _one_event_ledger(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "lifecycle_fsm", "--db", str(ws.db), "serve", "--port", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{port}: ") and done.stderr.count("\n") == 1
    assert "choose another --port" in done.stderr and "serving" not in done.stderr


def test_port_0_prints_the_port_it_serves_on(tmp_path: Path) -> None:
    """`serve --port 0` printed `http://127.0.0.1:0/…` while Uvicorn listened on a port of its choosing."""
    ws = _one_event_ledger(tmp_path)
    argv = [sys.executable, "-m", "lifecycle_fsm", "--db", str(ws.db), "serve", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        address = proc.stderr.readline().rsplit(" at ", 1)[1].strip()
        port = urllib.parse.urlsplit(address).port
        assert port, address
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{address}/chain_head.json?_shape=array", timeout=10) as r:
                    assert json.loads(r.read())[0]["seq"] == 1
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, address
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
