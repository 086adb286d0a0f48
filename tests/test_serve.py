"""`lifecycle serve` for real: a subprocess on a free loopback port, its canned queries, its refusals, a browser.

Datasette (extra `ui`) and Chromium (Debian's `chromium`) are needed; without them the
tests skip locally and fail in CI (`CI=true`), where `.ci/run` installs both.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
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
from conftest import REPO, Workspace

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import explain, verify
from lifecycle_fsm.store.base import event_at
from lifecycle_fsm.store.sqlite import SQLiteEventStore

CHROMIUM = Path("/usr/bin/chromium")
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

    def __init__(self, ws: Workspace, tmpdir: Path) -> None:
        self.port = _free_port()
        self.tmpdir = tmpdir
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lifecycle_fsm", "--db", str(ws.db), "serve", "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/-/versions.json")
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
            ("rlvr-rec", "sampling", "retry_sampling_from_prompt_queue"), ("grpo-block", "update", "block_update"),
        }  # fmt: skip
        events = server.query("candidate_events", id="dpo-good")
        assert [e["seq"] for e in events] == [e.seq for e in store.read_stream("candidate:dpo-good")]
        assert [e["type"] for e in events] == ["CandidateReceived", "ChecksRecorded", "HandoffDecided"]
        ready_seq = events[-1]["seq"]
        assert [r["id"] for r in server.query("ready_at", time="2099-01-01T00:00:00Z")] == ["dpo-good"]
        assert server.query("ready_at", time=events[0]["recorded_at"]) == []  # received, not yet ready
        assert [r["seq"] for r in server.query("ready_at", time=events[-1]["recorded_at"])] == [ready_seq]
        for garbage in ("not a time", "garbage", "-1"):  # an error, never `[]` ("nothing was ready then")
            status, doc = server.get("/ledger/ready_at.json?" + urllib.parse.urlencode({"_shape": "array",
                                                                                       "time": garbage}))  # fmt: skip
            assert status == 400 and doc["ok"] is False and doc["rows"] == [], (garbage, status, doc)
            assert doc["error"] == "user-defined function raised exception"  # lifecycle_utc refused it
        assert server.get("/ledger/ready_at?time=garbage")[0] == 400  # the HTML page shows the error too
        assert server.query("ready_at", time="") == server.query("ready_at") == []  # the blank form: no time yet
        offset = dt.datetime.fromisoformat(events[-1]["recorded_at"]).astimezone(dt.timezone(dt.timedelta(hours=-5)))
        assert [r["seq"] for r in server.query("ready_at", time=offset.isoformat())] == [ready_seq]  # same instant
        head = verify(store)["head"]
        assert server.query("chain_head") == [{**head, "recorded_at": event_at(store, head["seq"]).recorded_at,  # type: ignore[union-attr]
                                               "events": head["seq"]}]  # fmt: skip
        assert server.query("seals") == []
        status, meta = server.get("/-/metadata.json")
        assert status == 200 and meta["title"] == f"Ledger ledger: snapshot at seq {head['seq']}"
        assert set(meta["databases"]["ledger"]["queries"]) >= {"rejections", "ready_at", "chain_head", "seals"}
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


def test_a_browser_finds_a_rejected_id_on_the_rejections_page(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """Headless Chromium loads the rejections page; a rejected id is on it; the screenshot is kept as an artifact."""
    _need(CHROMIUM.exists(), "Chromium (apt-get install chromium)")
    _, states, server = served
    ARTIFACTS.mkdir(exist_ok=True)
    profile = server.tmpdir / "chromium-profile"
    flags = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1280,900",
    ]  # fmt: skip
    page = server.url("/ledger/rejections")
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Rejected candidates" in dom.stdout
    assert all(cid in dom.stdout for cid, s in states.items() if s == "reject")
    assert "dpo-good" not in dom.stdout
    shot = ARTIFACTS / "serve-rejections.png"
    shot.unlink(missing_ok=True)
    done = subprocess.run([*flags, f"--screenshot={shot}", page], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]


def test_stopping_the_server_removes_its_snapshot(served: tuple[Workspace, dict[str, str], Server]) -> None:
    """SIGTERM ends the server cleanly (exit 0) and the snapshot folder goes with it."""
    _, _, server = served
    assert [p.name for p in server.tmpdir.iterdir() if p.name.startswith("lifecycle-serve-")]
    code, err = server.stop()
    assert code == 0, err
    assert not [p for p in server.tmpdir.iterdir() if p.name.startswith("lifecycle-serve-")]


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
        done = subprocess.run([sys.executable, "-m", "lifecycle_fsm", "--db", str(ws.db), "serve", "--port", str(port)],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith(f"Error: cannot listen on 127.0.0.1:{port}: ") and done.stderr.count("\n") == 1
    assert "choose another --port" in done.stderr and "serving" not in done.stderr


def test_port_0_prints_the_port_it_serves_on(tmp_path: Path) -> None:
    """`serve --port 0` printed `http://127.0.0.1:0/…` while Uvicorn listened on a port of its choosing."""
    ws = _one_event_ledger(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "lifecycle_fsm", "--db", str(ws.db), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
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
