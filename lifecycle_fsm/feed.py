"""Reading the log as it grows: catch up (`events`), follow, wait for a state.

All three poll the store in pages (no cursor stays open while the caller writes); `seq` is gap-free
in commit order, so a reader that remembers the last seq it saw never skips one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator

import attrs

from lifecycle_fsm.errors import InputError, NotFoundError, WaitTimeout
from lifecycle_fsm.events import NAMED_STREAMS, Event, stream_of
from lifecycle_fsm.limits import check_int, check_seconds
from lifecycle_fsm.machine import State
from lifecycle_fsm.store.base import EventStore, select_events
from lifecycle_fsm.store.records import EventFilter, StoredEvent
from lifecycle_fsm.upcasting import decoded_event

PAGE = 500
_LOOK = 0.25  # how often a waiting follower looks at `stop` and a close from another thread
_STATES = {s.value: s for s in State}


@attrs.frozen(kw_only=True)
class FeedEvent:
    """One stored event with its decoded domain event (upcast to today's schema)."""

    seq: int
    stream_id: str
    version: int
    type: str
    recorded_at: str
    actor: str
    hash: str
    event_id: str
    event: Event

    @classmethod
    def of(cls, stored: StoredEvent) -> FeedEvent:
        columns = {f.name: getattr(stored, f.name) for f in attrs.fields(cls) if f.name != "event"}
        return cls(**columns, event=decoded_event(stored))


def _stream_filter(stream: str | None) -> str | None:
    """The stored stream id for `stream`: a candidate id, or `ledger` / `seals` themselves."""
    return stream if stream is None or stream in NAMED_STREAMS else stream_of(stream)


def _page(store: EventStore, after: int, stream_id: str | None) -> list[StoredEvent]:
    return list(select_events(store, EventFilter(after=after, stream_id=stream_id, limit=PAGE)))


def read_events(store: EventStore, *, after: int = 0, stream: str | None = None) -> Iterator[FeedEvent]:
    """Every stored event after seq `after` (of one stream, if given), in seq order, as of each page read.
    `after` is checked when called, not at the first `next()`."""
    return _read_events(store, check_int("after", after), _stream_filter(stream))


def _read_events(store: EventStore, after: int, stream_id: str | None) -> Iterator[FeedEvent]:
    while page := _page(store, after, stream_id):
        for stored in page:
            yield FeedEvent.of(stored)
        after = page[-1].seq
        if len(page) < PAGE:
            return


def follow_events(
    store: EventStore,
    *,
    after: int,
    poll: float,
    stream: str | None = None,
    stop: threading.Event | None = None,
    is_closed: Callable[[], bool] = lambda: False,
) -> Iterator[FeedEvent]:
    """New events as they are appended, until `stop` is set or the ledger is closed. Between polls it sleeps
    `poll` seconds (on PostgreSQL a commit wakes it); the arguments are checked when called."""
    after = check_int("after", after)
    poll = check_seconds("poll", poll, zero_ok=False)
    return _follow(store, after, poll, _stream_filter(stream), _stop_event(stop), is_closed)


def _stop_event(stop: object) -> threading.Event:
    """`follow`'s `stop`: None (a fresh event), or one with `is_set()` and a blocking `wait(timeout)`."""
    if stop is None:
        return threading.Event()
    if isinstance(stop, threading.Event):
        return stop
    import inspect  # only for a duck-typed one: not on every start-up

    wait = getattr(stop, "wait", None)
    if not callable(getattr(stop, "is_set", None)) or not callable(wait) or inspect.iscoroutinefunction(wait):
        raise InputError(
            f"follow: stop must be a threading.Event (anything with is_set() and a blocking wait(timeout)), not "
            f"{type(stop).__name__} ({stop!r}); an asyncio.Event cannot stop this blocking call"
        )
    return stop  # type: ignore[return-value]


def _follow(
    store: EventStore,
    after: int,
    poll: float,
    stream_id: str | None,
    stop: threading.Event,
    is_closed: Callable[[], bool],
) -> Iterator[FeedEvent]:
    # PostgreSQL wakes a follower on its commit NOTIFY (`wait_for_new`); polling by seq stays the truth.
    wait_for_new: Callable[..., bool] | None = getattr(store, "wait_for_new", None)

    def given_up() -> bool:
        return stop.is_set() or is_closed()

    while not given_up():
        # Filtered by stream, the wait below wakes on anything past the head: read it before
        # the page, so a commit that lands between the two wakes the wait instead of being missed.
        head = store.head().seq if wait_for_new is not None and stream_id is not None else after
        page = _page(store, after, stream_id)
        for stored in page:
            yield FeedEvent.of(stored)
            after = stored.seq
            if given_up():
                return
        if len(page) < PAGE:
            _pause(wait_for_new, head if stream_id is not None else after, poll, stop, given_up)


def _pause(
    wait_for_new: Callable[..., bool] | None,
    seq: int,
    poll: float,
    stop: threading.Event,
    given_up: Callable[[], bool],
) -> None:
    """Up to `poll` seconds for an event past `seq` (where the store can say) or until `given_up()`, whichever
    comes first (looked at every `_LOOK` seconds)."""
    if wait_for_new is not None:
        wait_for_new(seq, poll, given_up=given_up, look=_LOOK)
        return
    deadline = time.monotonic() + poll
    while not given_up() and (left := deadline - time.monotonic()) > 0:
        stop.wait(min(left, _LOOK))


def _wanted_states(states: object) -> tuple[State, ...]:
    """`wait_for`'s `states` as members: one `State` or state name (never its characters), or an iterable
    of them; anything else is an InputError saying what was given."""
    if isinstance(states, str):
        given: list[object] = [states]
    else:
        try:
            given = list(states)  # type: ignore[call-overload]
        except TypeError:
            raise InputError(
                f"wait_for: states must be a state or an iterable of states, not {type(states).__name__}"
            ) from None
    if not given:
        raise InputError(f"wait_for needs at least one state (one of {', '.join(State)})")
    wanted = []
    for state in given:
        member = _STATES.get(state) if isinstance(state, str) else None  # a member finds itself
        if member is None:
            raise InputError(f"wait_for: {state!r} is not a state (expected one of {', '.join(State)})")
        wanted.append(member)
    return tuple(wanted)


def wait_for_state(
    store: Callable[[], EventStore],
    current_state: Callable[[], str | None],
    *,
    candidate_id: str,
    states: State | str | Iterable[State | str],
    timeout: float,
    poll: float,
    is_closed: Callable[[], bool] = lambda: False,
) -> State:
    """Look at `current_state` every `poll` seconds until it is one of `states`; `WaitTimeout` after `timeout`
    seconds, or at once in reject (terminal) when reject is not wanted. An unknown candidate is not there yet."""
    seconds = check_seconds("timeout", timeout, zero_ok=True)
    poll = check_seconds("poll", poll, zero_ok=False)
    wanted = _wanted_states(states)
    give_up = time.monotonic() + seconds
    never = threading.Event()
    while True:
        now = store()  # the closed stand-in once the ledger is closed: its first use raises
        wait_for_new: Callable[..., bool] | None = getattr(now, "wait_for_new", None)
        head = now.head().seq if wait_for_new is not None else 0  # before the look: a commit after it wakes
        try:
            last = current_state()
        except NotFoundError:
            last = None
        if last is not None and last in wanted:
            return State(last)
        remaining = give_up - time.monotonic()
        if remaining <= 0 or last == State.REJECT:
            why = f"within {timeout} s" if remaining <= 0 else "(reject is terminal: it can reach nothing else)"
            raise WaitTimeout(
                f"candidate {candidate_id!r} did not reach {' | '.join(wanted)} {why} "
                f"(last state: {last or 'not received'})",
                candidate_id=candidate_id,
                states=tuple(str(s) for s in wanted),
                last_state=last,
            )
        _pause(wait_for_new, head, min(poll, remaining), never, is_closed)
