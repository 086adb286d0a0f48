"""`lifecycle report`: what it says, byte-stability, refusal and `--replace`, a failed verify, offline HTML."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from auditor_cases import auditor_ledger
from browser import CHROMIUM, Chromium, Page
from conftest import REPO, Workspace, invoke

from lifecycle_fsm.replay.report import MERMAID_ASSET, mermaid_js

MERMAID_SHA256 = "9f2807e402479d2864bfd9a95052076fc69d0ff45a0b25148b84b70fc33425b9"


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, dict[str, str]]:
    ws = Workspace(tmp_path_factory.mktemp("report"))
    return ws, auditor_ledger(ws)


def _report(db: Path, out: Path, *args: str) -> tuple[int, str]:
    result = invoke(db, "report", "--out", str(out), *args)
    return result.exit_code, result.stderr


def test_markdown_report_says_what_the_ledger_proves_and_decided(
    reported: tuple[Workspace, dict[str, str]], tmp_path: Path
) -> None:
    """Head and verify, candidates by state, each rejection's decisive evidence, recoveries, machine, paths."""
    ws, states = reported
    assert _report(ws.db, tmp_path / "a" / "b") == (0, "")  # --out is created
    text = (tmp_path / "a" / "b" / "ledger-report.md").read_text()
    head = json.loads(invoke(ws.db, "verify", "--json").stdout)["head"]
    assert f"| head seq | {head['seq']} |" in text and f"| head hash | `{head['hash']}` |" in text
    assert "| verify | ok |" in text and "| seals | none recorded (`lifecycle seal` signs the head) |" in text
    rejected = sorted(cid for cid, s in states.items() if s == "reject")
    assert f"| reject | {len(rejected)} | {', '.join(rejected)} |" in text
    assert "| ready | 1 | dpo-good |" in text and "| recovering | 1 | rlvr-rec |" in text
    for cid in rejected:
        doc = json.loads(invoke(ws.db, "explain", cid, "--json").stdout)
        event = doc["decisive_event"]
        assert f"### {cid}: reject" in text
        assert f"decided by seq {event['seq']} {event['type']}, recorded {event['recorded_at']}" in text
    assert "- file changed: adapter_model.safetensors" in text
    assert "- considered pre_update_checkpoint: invalidated" in text
    assert "| sampling | retry_sampling_from_prompt_queue | 1 | rlvr-rec (" in text
    assert "| update | block_update | 1 | grpo-block (" in text
    assert text.count("```mermaid") == 1 + len(states)  # the machine and one path per candidate
    assert "| item | value |" in text  # a header row that says something
    assert "flowchart TB" in text and "flowchart LR" in text  # the machine, and the paths
    assert re.search(r"s\d+ -->\|\"hand_off_ready \(seq \d+\)\"\| s\d+\[\"ready\"\]", text)


def test_report_is_byte_stable_for_the_same_ledger(reported: tuple[Workspace, dict[str, str]], tmp_path: Path) -> None:
    """Two runs, and a copy of the ledger under another name, give the same bytes (md and html)."""
    ws, _ = reported
    copy = tmp_path / "elsewhere" / "renamed.db"
    copy.parent.mkdir()
    shutil.copy(ws.db, copy)
    for fmt in ("md", "html"):
        outs = [tmp_path / f"{fmt}-{n}" for n in range(3)]
        for out, db in zip(outs, (ws.db, ws.db, copy), strict=True):
            assert _report(db, out, "--format", fmt) == (0, "")
        name = f"ledger-report.{fmt}"
        first = (outs[0] / name).read_bytes()
        assert all((out / name).read_bytes() == first for out in outs[1:])


def test_existing_report_is_refused_unless_replace(reported: tuple[Workspace, dict[str, str]], tmp_path: Path) -> None:
    """Exit 3 and nothing touched; --replace keeps one .previous; a second --replace with a .previous is refused."""
    ws, _ = reported
    target = tmp_path / "ledger-report.md"
    assert _report(ws.db, tmp_path)[0] == 0
    target.write_text("the auditor's annotated copy\n")
    code, err = _report(ws.db, tmp_path)
    assert code == 3 and err.startswith("Error: ") and "ledger-report.md" in err and err.count("\n") == 1
    assert target.read_text() == "the auditor's annotated copy\n"
    assert _report(ws.db, tmp_path, "--replace")[0] == 0
    assert (tmp_path / "ledger-report.md.previous").read_text() == "the auditor's annotated copy\n"
    assert target.read_text().startswith("# Ledger report")
    code, err = _report(ws.db, tmp_path, "--replace")
    assert code == 3 and "previous" in err


def test_failed_verify_is_reported_first_and_exits_6(
    reported: tuple[Workspace, dict[str, str]], tmp_path: Path
) -> None:
    """An edited row: the report is still written, says so at the top, shows no state, and the command exits 6."""
    ws, _ = reported
    copy = tmp_path / "tampered.db"
    shutil.copy(ws.db, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 5")
    result = invoke(copy, "report", "--out", str(tmp_path / "out"))
    assert result.exit_code == 6 and "verify FAILED" in result.stdout
    text = (tmp_path / "out" / "ledger-report.md").read_text()
    assert text.startswith("# Ledger report\n\n> **VERIFY FAILED** at seq 5: stored hash does not match")
    assert "No candidate state is shown" in text and "## Rejections" not in text
    assert "| checkpoints | not checked (the chain or the replay broke first) |" in text


def test_a_broken_checkpoint_names_its_position_and_keeps_the_states(
    reported: tuple[Workspace, dict[str, str]], tmp_path: Path
) -> None:
    """Only a checkpoint is broken: the report says where (never "at seq none") and still shows the
    states of the full replay."""
    ws, _ = reported
    copy = tmp_path / "garbled.db"
    shutil.copy(ws.db, copy)
    assert invoke(copy, "checkpoint").exit_code == 0
    with sqlite3.connect(copy) as conn:
        position = conn.execute("SELECT max(position) FROM checkpoints").fetchone()[0]
        assert position is not None
        conn.execute("UPDATE checkpoints SET snapshot = substr(snapshot, 1, length(snapshot) - 5) || 'xxxxx'")
    result = invoke(copy, "report", "--out", str(tmp_path / "out"))
    assert result.exit_code == 6
    text = (tmp_path / "out" / "ledger-report.md").read_text()
    assert f"> **VERIFY FAILED** at seq {position}: checkpoint " in text and "seq none" not in text
    assert "Candidate states below come from a full replay" in text and "## Rejections" in text


def test_html_is_self_contained(reported: tuple[Workspace, dict[str, str]], tmp_path: Path) -> None:
    """One file: the Markdown's content, the vendored Mermaid inlined, no external reference at all."""
    ws, _ = reported
    assert _report(ws.db, tmp_path, "--format", "html")[0] == 0
    page = (tmp_path / "ledger-report.html").read_text()
    outside_scripts = re.sub(r"<script>.*?</script>", "", page, flags=re.S)
    assert not re.search(r"""src\s*=|href\s*=\s*"(?!#)|<link|@import|url\(""", outside_scripts)  # in-page links only
    assert mermaid_js() in page and page.count('<pre class="mermaid">') >= 2
    assert '<h2 id="rejections">Rejections</h2>' in page and "<table>" in page


def test_html_has_contents_anchors_and_failed_in_colour(
    reported: tuple[Workspace, dict[str, str]], tmp_path: Path
) -> None:
    """A table of contents links to every section (and each rejection) by its anchor; the summary table's
    header row says what its columns are; every FAILED is marked for colour."""
    ws, states = reported
    assert _report(ws.db, tmp_path, "--format", "html")[0] == 0
    page = (tmp_path / "ledger-report.html").read_text()
    contents = page[page.index('<nav class="toc">') : page.index("</nav>")]
    links = re.findall(r'<a href="#([^"]+)">', contents)
    assert links[:2] == ["candidates-by-state", "rejections"] and "the-machine" in links
    assert all(f'id="{anchor}"' in page for anchor in links)
    assert sum(f"{cid}: reject" in contents for cid, s in states.items() if s == "reject") == list(
        states.values()
    ).count("reject")
    assert "<th>item</th>" in page and "<th></th>" not in page
    assert 'artifact (<span class="failed">FAILED</span>)' in page.replace("Artifact", "artifact")
    assert not re.search(r"(?<!>)FAILED(?!</span>)", page.split("<script>")[0])


def test_vendored_mermaid_is_the_pinned_build() -> None:
    """The inlined Mermaid is byte-for-byte the npm release named in replay/assets/README.md."""
    data = (REPO / "replay" / "assets" / MERMAID_ASSET).read_bytes()
    assert hashlib.sha256(data).hexdigest() == MERMAID_SHA256
    assert MERMAID_SHA256 in (REPO / "replay" / "assets" / "README.md").read_text()


def _need_chromium() -> None:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium is missing in CI (.ci/run installs it)")
        pytest.skip("Chromium is not installed")


MACHINE_SVG = "#the-machine + pre.mermaid > svg"
PATH_SVG = "details.folded pre.mermaid > svg"


def _count(page: Page, selector: str) -> int:
    return int(page.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length"))


def _drawn_paths(page: Page) -> list[str]:
    """The summaries of the blocks whose path diagram is drawn, in page order."""
    drawn = page.evaluate(
        "Array.from(document.querySelectorAll('details.folded')).filter((d) => d.querySelector('pre.mermaid > svg'))"
        ".map((d) => d.querySelector('summary').textContent.trim())"
    )
    return list(drawn)


def test_html_folds_each_candidate_path_into_a_closed_block(
    reported: tuple[Workspace, dict[str, str]], tmp_path: Path
) -> None:
    """The machine stays open on the page; each candidate's path is a closed <details> named by id and state."""
    ws, states = reported
    assert _report(ws.db, tmp_path, "--format", "html")[0] == 0
    page = (tmp_path / "ledger-report.html").read_text()
    machine, paths = page.split('<h2 id="candidate-paths">Candidate paths</h2>\n')
    assert machine.count('<pre class="mermaid">') == 1 and "flowchart TB" in machine and "<details" not in machine
    pattern = r'<details class="folded">\n<summary><h3 id="[^"]+">(.*?)</h3>\n</summary>\n(.*?)</details>\n'
    blocks = re.findall(pattern, paths, flags=re.S)
    assert [title for title, _ in blocks] == [f"{cid}: {state}" for cid, state in sorted(states.items())]
    assert all(body.count('<pre class="mermaid">flowchart LR') == 1 for _, body in blocks)
    assert paths.count("<details") == len(states) and "<details open" not in page


def test_html_diagrams_render_offline_in_chromium(reported: tuple[Workspace, dict[str, str]], tmp_path: Path) -> None:
    """Headless Chromium draws the machine on load and each path once its block is opened, all offline."""
    _need_chromium()
    ws, states = reported
    assert _report(ws.db, tmp_path, "--format", "html")[0] == 0
    page_uri = (tmp_path / "ledger-report.html").as_uri()
    with Chromium(tmp_path / "profile") as browser:
        page = browser.open(page_uri)
        assert page.settle()
        assert (_count(page, MACHINE_SVG), _count(page, PATH_SVG)) == (1, 0)
        page.evaluate("document.querySelectorAll('details.folded').forEach((d) => { d.open = true; })")
        assert page.settle()
        assert _count(page, MACHINE_SVG) == 1
        assert _drawn_paths(page) == [f"{cid}: {state}" for cid, state in sorted(states.items())]
        assert _count(page, 'svg[aria-roledescription="error"]') == 0  # how Mermaid draws what it cannot parse
        assert page.requested() == [page_uri]  # the page asked for nothing but itself
        assert _overlapping_labels(page) == []
        fills = page.evaluate(
            f"Object.fromEntries(Array.from(document.querySelectorAll({json.dumps(MACHINE_SVG + ' g.node')}))"
            ".map((n) => [n.textContent.split(/stays on/)[0].trim(), getComputedStyle(n.querySelector('rect')).fill]))"
        )
        assert len({fills["ready"], fills["reject"], fills["received"]}) == 3  # ready and reject told apart


def _overlapping_labels(page: Page) -> list[tuple[str, str]]:
    """Pairs of the machine's edge labels whose drawn boxes overlap (each label's text, as drawn)."""
    boxes = page.evaluate(
        f"Array.from(document.querySelectorAll({json.dumps(MACHINE_SVG + ' g.edgeLabel')}))"
        ".filter((e) => e.textContent.trim()).map((e) => { const r = e.getBoundingClientRect();"
        " return [e.textContent.trim(), r.left, r.top, r.right, r.bottom]; })"
    )
    return [
        (a[0], b[0])
        for n, a in enumerate(boxes)
        for b in boxes[n + 1 :]
        if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
    ]


@pytest.fixture
def many_candidates(tmp_path: Path) -> tuple[Workspace, list[str]]:
    """A ledger of 300 candidates (a third of them handed off as ready): a report with 301 diagrams."""
    ws = Workspace(tmp_path / "many")
    ws.root.mkdir()
    ids = [f"dpo-{n:03d}" for n in range(300)]
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        for n, cid in enumerate(ids):
            led.receive(ws.dpo(cid))
            led.check(cid)
            if n % 3 == 0:
                led.hand_off(cid)
    return ws, ids


@pytest.mark.slow
def test_html_report_of_many_candidates_draws_only_what_is_opened(
    many_candidates: tuple[Workspace, list[str]], tmp_path: Path
) -> None:
    """300 candidates: once the page settles only the machine is drawn; a click on a candidate draws its path.

    Drawing every path on load kept the page busy ~0.2-0.8 s per diagram (minutes for a big
    ledger). No timing is asserted: the page is let run until it is idle, then its diagrams counted.
    """
    _need_chromium()
    ws, ids = many_candidates
    assert _report(ws.db, tmp_path / "out", "--format", "html")[0] == 0
    page_uri = (tmp_path / "out" / "ledger-report.html").as_uri()
    with Chromium(tmp_path / "profile") as browser:
        page = browser.open(page_uri)
        page.settle(cap=90)  # idle, or 90 s passed: either way, count what the page drew meanwhile
        assert (_count(page, MACHINE_SVG), _count(page, PATH_SVG)) == (1, 0)
        assert _count(page, "details.folded:not([open])") == len(ids)
        page.click("details.folded:nth-of-type(151) > summary")  # a real mouse click on dpo-150's summary
        assert page.settle()
        assert _drawn_paths(page) == ["dpo-150: ready"]
        path = page.evaluate(f"document.querySelector({json.dumps(PATH_SVG)}).textContent")
        assert "hand_off_ready" in path and "ready" in path
        page.click("details.folded:nth-of-type(2) > summary")
        assert page.settle()
        assert _drawn_paths(page) == ["dpo-001: verified", "dpo-150: ready"]
        assert _count(page, PATH_SVG) == 2 and _count(page, MACHINE_SVG) == 1


def test_report_shows_the_seals_verify_checked(tmp_path: Path) -> None:
    """A sealed ledger's report counts its seals (as verify checked them) and names the signing key."""
    ws = Workspace(tmp_path / "ws")
    for args in (["init"], ["baseline", "activate", str(ws.baseline())], ["receive", str(ws.dpo())]):
        assert invoke(ws.db, *args).exit_code == 0
    key = json.loads(invoke(ws.db, "key", "new", "--out", str(tmp_path / "keys"), "--json").stdout)
    sealed = invoke(ws.db, "--signing-key", str(tmp_path / "keys" / "lifecycle-signing.key"), "seal", "--json")
    assert sealed.exit_code == 0, sealed.stderr
    seq = json.loads(sealed.stdout)["seq"]
    assert _report(ws.db, tmp_path / "r") == (0, "")
    text = (tmp_path / "r" / "ledger-report.md").read_text()
    assert f"| seals | 1 seal(s), keys \\[{key['key_id']}\\], last at seq {seq + 1} (each sealed hash" in text


def test_an_id_written_as_markdown_is_shown_as_text_never_as_a_link_or_an_image(tmp_path: Path) -> None:
    """Whoever writes a manifest chooses its id: one spelt as a Markdown image or link must not make the
    auditor's browser fetch anything nor dress a link up as another candidate (report and explain)."""
    ws = Workspace(tmp_path / "ws")
    beacon, disguised = "![x](http://127.0.0.1:9/beacon.png)", "[dpo-v5 evidence](https://evil.example/login)"
    assert invoke(ws.db, "baseline", "activate", str(ws.baseline())).exit_code == 0
    for n, cid in enumerate((beacon, disguised, "dpo&#45;v5")):
        assert invoke(ws.db, "receive", str(ws.dpo(f"m{n}", policy_version=cid))).exit_code == 0
    assert _report(ws.db, tmp_path / "r", "--format", "html") == (0, "")
    page = (tmp_path / "r" / "ledger-report.html").read_text().split("<script>")[0]  # the drawing code aside
    assert "<img" not in page and '<a href="http' not in page
    assert "beacon.png" in page and "evil.example/login" in page  # shown, as text
    assert "dpo&amp;#45;v5" in page and "dpo-v5:" not in page  # an entity is shown as written
    assert _report(ws.db, tmp_path / "m") == (0, "")
    markdown = (tmp_path / "m" / "ledger-report.md").read_text()
    assert "\\!\\[x\\](http://127.0.0.1:9/beacon.png)" in markdown
    explained = invoke(ws.db, "explain", disguised, "--format", "md")
    assert explained.exit_code == 0
    assert "## \\[dpo-v5 evidence\\](https://evil.example/login): received" in explained.stdout


def test_report_as_of_a_seq_or_a_time_shows_the_candidates_then(
    reported: tuple[Workspace, dict[str, str]], tmp_path: Path
) -> None:
    """`--as-of SEQ` and `--as-of TIME` show the candidates as they were then (the same bytes for the
    same position); the head and verify stay the whole log's; a seq past the head exits 3."""
    ws, _ = reported
    events = json.loads(invoke(ws.db, "history", "dpo-good", "--json").stdout)
    checked, handed_off = events[-2], events[-1]
    assert (checked["type"], handed_off["type"], handed_off["seq"] - checked["seq"]) == (
        "ChecksRecorded",
        "HandoffDecided",
        1,
    )
    assert _report(ws.db, tmp_path / "seq", "--as-of", str(checked["seq"])) == (0, "")
    assert _report(ws.db, tmp_path / "time", "--as-of", checked["recorded_at"]) == (0, "")
    text = (tmp_path / "seq" / "ledger-report.md").read_text()
    assert text == (tmp_path / "time" / "ledger-report.md").read_text()
    head = json.loads(invoke(ws.db, "verify", "--json").stdout)["head"]
    assert text.startswith(f"# Ledger report as of seq {checked['seq']}\n") and f"| head seq | {head['seq']} |" in text
    assert "| ready | 0 | - |" in text and "| verified | 1 | dpo-good |" in text
    assert "rlvr-rec" not in text  # received after that position
    result = invoke(ws.db, "report", "--out", str(tmp_path / "past"), "--as-of", str(head["seq"] + 1))
    assert result.exit_code == 3 and "past the head" in result.stderr


def test_a_report_reads_the_ledger_stream_once_however_many_candidates(ws: Workspace) -> None:
    """Each candidate's rollback evidence needs the baseline activations; a report read the whole
    ledger stream once per candidate (1,000 candidates after 2,000 settings changes: 6 s instead of
    0.4 s). It reads the activations once; the statements say so (SQLite's own trace)."""
    from lifecycle_fsm.replay.report import build_report
    from lifecycle_fsm.store.sqlite import SQLiteEventStore

    with ws.ledger() as led:
        led.activate_baseline(ws.baseline())
        for n in range(5):
            led.receive(ws.dpo(f"dpo-{n}"))
            led.check(f"dpo-{n}")
        store = led.store
        assert isinstance(store, SQLiteEventStore)
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        doc = build_report(store).to_json()
        store._conn.set_trace_callback(None)
    assert all(doc["candidates"][f"dpo-{n}"]["rollback"]["activated_seq"] is not None for n in range(5))
    ledger_reads = [s for s in statements if "stream_id = 'ledger'" in s]
    assert len(ledger_reads) == 1, ledger_reads


def test_a_seal_that_fails_hides_the_states_as_a_broken_chain_does(tmp_path: Path) -> None:
    """A chain edited and re-hashed holds as a chain, but its seal no longer matches: the report shows
    no candidate state (they would come from a forged log), not the 'only a checkpoint' wording."""
    from test_trust_seals import _rehash_everything

    ws = Workspace(tmp_path / "ws")
    for args in (["init"], ["baseline", "activate", str(ws.baseline())], ["receive", str(ws.dpo())]):
        assert invoke(ws.db, *args).exit_code == 0
    assert invoke(tmp_path / "unused.db", "key", "new", "--out", str(tmp_path / "keys")).exit_code == 0
    assert invoke(ws.db, "--signing-key", str(tmp_path / "keys" / "lifecycle-signing.key"), "seal").exit_code == 0
    edit = "UPDATE events SET payload = replace(payload, '\"eval-v1\"', '\"eval-vX\"') WHERE seq = 3"
    _rehash_everything(ws.db, edit)
    assert _report(ws.db, tmp_path / "r")[0] == 6
    text = (tmp_path / "r" / "ledger-report.md").read_text()
    assert "> **VERIFY FAILED** at seq" in text and ": seal_mismatch" in text
    assert "No candidate state is shown" in text and "only a checkpoint is broken" not in text
