"""Per-file digests of a directory artifact: the listing `hash_tree` keeps, its cap, and what explain compares."""

from __future__ import annotations

from pathlib import Path

from lifecycle_fsm.artifacts import MAX_LISTED_FILES, hash_directory, hash_tree
from lifecycle_fsm.replay.explain import file_changes


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_listing_is_what_the_tree_hash_was_built_from(tmp_path: Path) -> None:
    """Relative POSIX paths in stream order, sizes and digests; the same hash as hash_directory."""
    folder = _tree(tmp_path / "a", {"b/w.bin": b"weights", "c.json": b"{}"})
    digest = hash_tree(folder)
    assert digest.sha256 == hash_directory(folder) and (digest.count, digest.size) == (2, 9)
    assert [(p, n) for p, n, _ in digest.files or ()] == [("b/w.bin", 7), ("c.json", 2)]
    assert digest.to_json() == {
        "count": 2,
        "size": 9,
        "files": [{"path": p, "size": n, "sha256": h} for p, n, h in digest.files or ()],
    }
    single = hash_tree(folder / "c.json")
    assert (single.is_directory, single.files, single.to_json()) == (False, None, None)


def test_above_the_cap_only_the_hash_and_count_are_kept(tmp_path: Path) -> None:
    """A tree with more files than the cap keeps no listing, and explain says it compared tree hashes only."""
    folder = _tree(tmp_path / "big", {f"f{i}": b"x" for i in range(3)})
    capped = hash_tree(folder, max_listed=2)
    assert (capped.files, capped.count, capped.sha256) == (None, 3, hash_directory(folder))
    assert MAX_LISTED_FILES == 1000
    changes = file_changes(hash_tree(folder).to_json(), capped.to_json()).to_json()
    assert changes["compared"] is False and "3 files: above the listing cap" in changes["note"]


def test_file_changes_names_added_removed_and_changed(tmp_path: Path) -> None:
    """Changed by size or digest, added and removed by path, each list sorted."""
    before = hash_tree(_tree(tmp_path / "x", {"a": b"1", "b": b"2", "c": b"3"})).to_json()
    after = hash_tree(_tree(tmp_path / "y", {"a": b"1", "b": b"22", "d": b"4"})).to_json()
    changes = file_changes(before, after).to_json()
    assert (changes["added"], changes["removed"]) == (["d"], ["c"])
    assert [(c["path"], c["recorded"]["size"], c["checked"]["size"]) for c in changes["changed"]] == [("b", 1, 2)]
