"""Whole-ledger replay: fold every event after a starting point into states.

This is the hot path of recovery and audit, so it works on plain row tuples and
payload dicts (no record objects), streams rows in batches (memory stays flat as
the log grows), and validates every move with the machine's dict table through the
per-type steps of `state.REPLAY_STEPS`, built from the same rule the command side
folds with (`state._candidate_step`). A payload an event keeps whole (`KEPT_AS`: a
check, a hand-off, a plan) is kept as its stored row and parsed again once, when the
fold ends (`_frozen`). It has no side effects: the same rows give the same states.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import orjson

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import CANDIDATE_PREFIX, LEDGER_STREAM, SEALS_STREAM, candidate_id_of, stream_of
from lifecycle_fsm.state import (
    KEPT_FIELDS,
    REPLAY_STEPS,
    CandidateState,
    LedgerSettings,
    apply_settings,
    kept_payload,
    not_a_candidate_event,
)
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import canonical_json, check_rows, fold_columns
from lifecycle_fsm.store.records import EventFilter, StreamHead
from lifecycle_fsm.upcasting import CURRENT_VERSIONS, edited_row_error, upcast

__all__ = ["LedgerState", "fold_rows", "index_of", "snapshot_json"]


@attrs.frozen
class LedgerState:
    """Every candidate and the ledger settings as of `position`."""

    settings: LedgerSettings
    candidates: dict[str, CandidateState]
    position: int
    # Versions of the streams that change no state (`seals`): for the index, not in snapshots.
    streams: dict[str, int] = attrs.Factory(dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "settings": attrs.asdict(self.settings, recurse=False),
            "candidates": {cid: c.to_dict() for cid, c in sorted(self.candidates.items())},
        }


def empty_state() -> LedgerState:
    return LedgerState(LedgerSettings(), {}, 0)


def index_of(state: LedgerState) -> list[StreamHead]:
    """The stream index a fold implies (what `replay --full` rebuilds the cache from)."""
    heads = [
        StreamHead(stream_of(cid), c.version, c.state, c.kind if isinstance(c.kind, str) else None)
        for cid, c in sorted(state.candidates.items())
    ]
    if state.settings.version:
        heads.append(StreamHead(LEDGER_STREAM, state.settings.version, None, None))
    heads.extend(StreamHead(sid, version, None, None) for sid, version in sorted(state.streams.items()))
    return sorted(heads, key=lambda h: h.stream_id)


def snapshot_json(state: LedgerState) -> str:
    """The canonical text of a state: what checkpoints store and replays are compared by."""
    return canonical_json(state.to_json())


def fold_batches(store: EventStore, *, after: int, to: int | None, checked: bool) -> Iterable[Sequence[Sequence[Any]]]:
    """The fold's input: plain rows, or whole rows each re-hashed first (`chain.check_rows`)."""
    rows = store.select_rows(EventFilter(after=after, before=None if to is None else to + 1))
    if checked:
        return check_rows(rows, error=edited_row_error)
    return (list(map(fold_columns, batch)) for batch in rows)


def fold_rows(
    store: EventStore,
    start: LedgerState,
    *,
    to: int | None = None,
    checked: bool = False,
    batches: Iterable[Sequence[Sequence[Any]]] | None = None,
) -> LedgerState:
    """Fold the events after `start.position` (up to `to`) onto `start`.

    `checked` recomputes each row's own hash before folding it (what `status`, `replay`
    and `audit` ask for: fail closed). `batches`: rows already checked by the caller
    (`verify` hands on its chain walk's), read instead of the store.

    The loop is the replay hot path (issue #13): a row of a candidate this fold already
    holds, of a candidate event type at this code's schema version, is parsed and handed
    to its type's step here; every other row (a new stream, the ledger's or the seals'
    stream, an old schema version, anything unknown) goes through `_other_row`, which
    judges it in the same order of checks.
    """
    settings = start.settings
    # Working dicts keyed by stream id: one dict look-up per event finds the candidate.
    works: dict[str, dict[str, Any]] = {stream_of(cid): c.to_work() for cid, c in start.candidates.items()}
    position = start.position
    loads = orjson.loads
    # type -> (schema version, step, KEPT_AS field), taken per fold: an upcast test may change the versions.
    hot = {name: (CURRENT_VERSIONS.get(name), step, kept_as) for name, (step, kept_as) in REPLAY_STEPS.items()}
    if batches is None:
        batches = fold_batches(store, after=start.position, to=to, checked=checked)
    streams = dict(start.streams)
    for rows in batches:
        for row in rows:
            seq, stream_id, version, type_name, schema_version, text = row
            if seq != position + 1:
                raise CorruptionError(f"seq {seq} follows seq {position}: a gap in the log", seq=seq)
            position = seq
            work = works.get(stream_id)
            entry = hot.get(type_name)
            if work is None or entry is None or entry[0] != schema_version:
                settings = _other_row(row, works, streams, settings)
                continue
            try:
                payload = loads(text)
            except ValueError:
                payload = None
            if type(payload) is not dict:
                raise _unparsed(seq, type_name, text)
            _, step, kept_as = entry
            folded = step(work, payload, seq, stream_id, version)
            if folded is not work:  # a revision's fresh record
                works[stream_id] = folded
            if kept_as is not None:  # the stored row, not the parsed payload: see `_frozen`
                folded[kept_as] = row
    candidates = {candidate_id_of(sid) or sid: _frozen(work) for sid, work in works.items()}
    return LedgerState(settings, candidates, position, streams)


def _unparsed(seq: int, type_name: str, text: Any) -> CorruptionError:
    """Why a stored payload is not a JSON object (parsed again: only on the way to an error)."""
    try:
        orjson.loads(text)
    except ValueError as e:
        return CorruptionError(f"seq {seq}: {type_name} payload is not JSON ({e})", seq=seq)
    return CorruptionError(f"seq {seq}: {type_name} payload is not an object", seq=seq)


def _parsed(seq: int, type_name: str, schema_version: int, text: Any) -> dict[str, Any]:
    """A stored payload as a dict at this code's schema version, or the error naming its row."""
    try:
        payload = orjson.loads(text)
    except ValueError:
        payload = None
    if type(payload) is not dict:
        raise _unparsed(seq, type_name, text)
    parsed: dict[str, Any] = payload
    if CURRENT_VERSIONS.get(type_name) != schema_version:
        parsed = upcast(type_name, schema_version, parsed, seq=seq)
    return parsed


def _other_row(
    row: Sequence[Any], works: dict[str, dict[str, Any]], streams: dict[str, int], settings: LedgerSettings
) -> LedgerSettings:
    """Every row the hot loop does not take, judged in its order: payload, schema version, stream, move."""
    seq, stream_id, version, type_name, schema_version, text = row
    payload = _parsed(seq, type_name, schema_version, text)
    work = works.get(stream_id)
    if work is not None or stream_id.startswith(CANDIDATE_PREFIX):
        entry = REPLAY_STEPS.get(type_name)
        if entry is None:
            raise not_a_candidate_event(seq, type_name)
        step, kept_as = entry
        folded = works[stream_id] = step(work, payload, seq, stream_id, version)
        if kept_as is not None:
            folded[kept_as] = row
    elif stream_id == LEDGER_STREAM:
        settings = apply_settings(settings, type_name, payload, seq)
    elif stream_id == SEALS_STREAM:
        streams[stream_id] = version  # a seal decides nothing: only its stream's version is kept
    else:
        raise CorruptionError(f"seq {seq}: unknown stream {stream_id!r}", seq=seq)
    return settings


def _frozen(work: dict[str, Any]) -> CandidateState:
    """A working dict as a state, its kept payloads parsed again from their stored rows.

    Keeping the row (a few hundred bytes of text per candidate) instead of a payload's
    dozens of objects, until the end, is most of what replay saves over keeping the dicts
    (no cold payload to free on every check, hand-off or plan). The row was parsed,
    upcast and checked when its event was folded; the same steps here give the same payload.
    """
    for name in KEPT_FIELDS:
        kept = work[name]
        if kept is not None and type(kept) is not dict:
            seq, _, _, type_name, schema_version, text = kept
            work[name] = kept_payload(_parsed(seq, type_name, schema_version, text), seq)
    return CandidateState.from_work(work)
