"""Artifact digests re-used within one Ledger while no file changed, and said so in the event.

Real files hashed on disk, a real SQLite ledger. A digest is re-used only while every
file's (device, inode, size, mtime_ns, ctime_ns) is what it was when its bytes were
read; `rehash=True`, `--rehash` and the audit read every byte.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Workspace, invoke

from lifecycle_fsm.artifacts import DigestCache, hash_tree
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now


def ticking() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"2026-12-01T00:00:{next(counter):02d}.000000Z"


def _ready(ws: Workspace, clock: Callable[[], str]) -> Ledger:
    led = Ledger.open(ws.db, synchronous="NORMAL", clock=clock)
    led.init()
    led.activate_baseline(ws.baseline())
    led.receive(ws.dpo())
    return led


def _last_check(led: Ledger) -> dict[str, Any]:
    """The newest ChecksRecorded payload, with its event's `recorded_at` added."""
    stored = [e for e in led.store.read_stream("candidate:dpo-v5") if e.type == "ChecksRecorded"][-1]
    assert stored.schema_version == 1
    return {**json.loads(stored.payload), "recorded_at": stored.recorded_at}


def _weights(ws: Workspace) -> Path:
    found = sorted(ws.root.rglob("adapter_model.safetensors"))
    weights = next(p for p in found if "dpo-v5" in str(p))
    return weights


def test_a_second_check_reuses_both_digests_and_says_since_when(ws: Workspace) -> None:
    """The first check reads the bytes (reused_from null); the next, nothing changed, says when they were read."""
    with _ready(ws, utc_now) as led:
        led.check("dpo-v5")
        first = _last_check(led)
        assert (first["artifact"]["reused_from"], first["rollback"]["reused_from"]) == (None, None)
        led.check("dpo-v5")
        second = _last_check(led)
    for name in ("artifact", "rollback"):
        # read during the first check: before that check's event was stamped
        assert isinstance(second[name]["reused_from"], str)
        assert second[name]["reused_from"] <= first["recorded_at"] < second["recorded_at"]
        assert second[name]["actual"] == first[name]["actual"] and second[name]["verified"]
        assert second[name]["tree"] == first[name]["tree"]


def test_same_size_and_restored_mtime_is_still_caught(ws: Workspace) -> None:
    """Bytes changed in place, size kept, mtime put back: ctime moved, so the bytes are read and the check fails."""
    with _ready(ws, ticking()) as led:
        led.check("dpo-v5")
        weights = _weights(ws)
        before = os.stat(weights)
        time.sleep(0.01)  # let the clock tick past the first stat's ctime
        data = bytearray(weights.read_bytes())
        data[0] ^= 0xFF
        weights.write_bytes(bytes(data))
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(weights)
        assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
        assert after.st_ctime_ns != before.st_ctime_ns
        result = led.check("dpo-v5")
        check = _last_check(led)
    assert check["artifact"]["reused_from"] is None
    assert check["artifact"]["verified"] is False and "artifact" in check["reason_codes"]
    assert result.state == "reject"


def test_rehash_reads_every_byte(ws: Workspace) -> None:
    """`rehash=True` never re-uses a digest, even with nothing changed."""
    with _ready(ws, ticking()) as led:
        led.check("dpo-v5")
        led.check("dpo-v5", rehash=True)
        check = _last_check(led)
    assert (check["artifact"]["reused_from"], check["rollback"]["reused_from"]) == (None, None)


def test_cli_check_and_handoff_take_rehash(ws: Workspace) -> None:
    with _ready(ws, ticking()):
        pass
    done = invoke(ws.db, "check", "dpo-v5", "--rehash", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["state"] == "verified"
    done = invoke(ws.db, "handoff", "dpo-v5", "--rehash", "--json")
    assert done.exit_code == 0, done.output


def test_cache_sees_a_new_file_in_a_folder(tmp_path: Path) -> None:
    """A file added to a hashed folder changes the walk: read again, a different digest."""
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a" * 100)
    cache = DigestCache(ticking())
    first, when = cache.hash_tree(folder)
    assert when is None and first == hash_tree(folder)
    again, when = cache.hash_tree(folder)
    assert again == first and when == "2026-12-01T00:00:01.000000Z"
    (folder / "b.bin").write_bytes(b"b")
    third, when = cache.hash_tree(folder)
    assert when is None and third == hash_tree(folder) and third.sha256 != first.sha256
