"""Bounds on what the ledger accepts from outside, so hostile or mistaken input ends in one quick
`InputError`: input files are opened non-blocking (a FIFO), must be regular and are read up to a cap
(`/dev/zero`); ids are printable text of bounded length; text shown on a terminal has its control
characters spelled out (`display`)."""

from __future__ import annotations

import math
import os
import re
import stat
import threading
import unicodedata

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.events import CANDIDATE_PREFIX, LEDGER_STREAM, NAMED_STREAMS, SEALS_STREAM

MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a manifest is metadata: 16 MiB is far beyond any real one
MAX_SCENARIO_BYTES = 1024 * 1024  # a drill scenario is a hand-written YAML file
MAX_CANDIDATE_ID_LENGTH = 256  # characters; ids are shown in tables and used as stream names
MAX_INT64 = 2**63 - 1  # the largest integer SQLite, PostgreSQL's bigint and JSON readers all keep exactly
# Keys, pinned heads and attestations are small files read whole: the caps only stop /dev/zero and the like.
MAX_KEY_BYTES = 64 * 1024  # an Ed25519 PEM key is ~120 bytes; room for comments, never megabytes
MAX_SIGNED_HEAD_BYTES = 64 * 1024  # a signed head (`seal` writes it) is ~400 bytes of JSON
MAX_ATTESTATION_BYTES = 16 * 1024 * 1024  # a DSSE envelope is a few kB; the manifest cap, as it quotes one

# A command that appends several events keys them KEY, KEY/1, KEY/2, ... (`command_path`).
_SUB_KEY = re.compile(r"/[0-9]+\Z")

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_regular_file(path: str | os.PathLike[str], *, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or an InputError naming `what`. The descriptor
    (opened O_NONBLOCK: a FIFO never blocks the open) must be a regular file and is read to at most
    `limit + 1` bytes, so a file that grows or lies about its size is still bounded."""
    shown = os.fspath(path)
    try:
        fd = os.open(shown, _READ_FLAGS)
    except FileNotFoundError:
        raise InputError(f"no such {what}: {shown}") from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory, not a file: {shown}") from None
    except OSError as e:
        raise InputError(f"cannot read {what} {shown}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{what} is a directory, not a file: {shown}")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} is not a regular file (a device, FIFO or socket): {shown}")
        if st.st_size > limit:
            raise InputError(f"{what} {shown} is {st.st_size} bytes, over the {limit}-byte limit")
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total) or 1):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise InputError(f"{what} {shown} is over the {limit}-byte limit")
        return b"".join(chunks)
    except OSError as e:
        raise InputError(f"cannot read {what} {shown}: {e.strerror}") from None
    finally:
        os.close(fd)


def check_int(name: str, value: object, *, minimum: int = 0, maximum: int = MAX_INT64) -> int:
    """`value` if it is an int (a bool is not) in `minimum..maximum`, else an InputError naming `name`. The
    default bound is what every store keeps exactly: a larger window could be stored and never go lower."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{name} must be an integer, not {value!r}")
    if not minimum <= value <= maximum:
        raise InputError(f"{name} must be between {minimum} and {maximum}, not {value}")
    return value


def check_seconds(name: str, value: object, *, zero_ok: bool) -> float:
    """A finite, non-negative number of seconds (positive unless `zero_ok`), else an InputError: a wait on
    NaN never ends, and infinity or values past `threading.TIMEOUT_MAX` overflow the sleep."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InputError(f"{name} must be a number of seconds, not {value!r}")
    if (isinstance(value, float) and not math.isfinite(value)) or value < 0 or (value == 0 and not zero_ok):
        shape = "a finite number of seconds, at least 0" if zero_ok else "a finite number of seconds above 0"
        raise InputError(f"{name} must be {shape}, not {value!r}")
    if value > threading.TIMEOUT_MAX:  # compared before float(): a huge int would overflow it
        raise InputError(f"{name} is {value!r} s, over the {threading.TIMEOUT_MAX:.0f} s a wait can take")
    return float(value)


def _is_printable(ch: str) -> bool:
    # Cc control (C0, DEL, C1: ESC is here), Cf format (bidi overrides, zero-width), Zl/Zp separators.
    return ch == " " or unicodedata.category(ch)[0] not in "CZ"


def _check_length(what: str, value: str) -> None:
    if len(value) > MAX_CANDIDATE_ID_LENGTH:
        raise InputError(f"{what} is {len(value)} characters, over the {MAX_CANDIDATE_ID_LENGTH}-character limit")


def _printed_once(what: str, value: str, hint: str) -> None:
    """An id that prints as no other id does: no control or format characters, no leading or trailing
    whitespace, and nothing but Unicode NFC (`é` decomposed is two code points that print as one)."""
    if not all(_is_printable(ch) for ch in value):
        raise InputError(f"{what} {value!r} contains control or format characters")
    if value != value.strip():
        raise InputError(f"{what} {value!r} starts or ends with whitespace: it would print like another id ({hint})")
    if not value.isascii() and not unicodedata.is_normalized("NFC", value):
        composed = unicodedata.normalize("NFC", value)
        raise InputError(
            f"{what} {value!r} is not in Unicode NFC form: it prints like {composed!r}, another id "
            f"({hint}, written in NFC)"
        )


# Characters that reorder what follows them on screen (an actor `bob\u202eevil` prints reversed).
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def check_actor(actor: object) -> str:
    """Who the events say recorded them: 1..256 characters, no leading or trailing whitespace, no control
    character (a newline forges a `log` line) nor one that reorders the text; any script with its spaces
    and joiners is fine (a Persian name with its zero-width non-joiner)."""
    if not isinstance(actor, str):
        raise InputError(f"actor must be a string, not {type(actor).__name__} ({actor!r})")
    if not actor.strip():
        raise InputError(f"actor {actor!r} is blank")
    _check_length("actor", actor)
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp") or ch in _BIDI_CONTROLS for ch in actor):
        raise InputError(f"actor {actor!r} contains control or format characters")
    if actor != actor.strip():
        raise InputError(f"actor {actor!r} starts or ends with whitespace")
    return actor


def check_candidate_id(candidate_id: str, *, hint: str = "give another id with --id") -> str:
    """A candidate id is 1..256 printable characters that name one stream unambiguously (see
    `_printed_once`), neither a named stream (`ledger`, `seals`) nor starting with the candidates' stream
    prefix; else InputError. `hint`: what the caller can do instead."""
    if not isinstance(candidate_id, str):
        raise InputError(f"a candidate id is a string, not {type(candidate_id).__name__} ({candidate_id!r})")
    if not candidate_id.strip():
        raise InputError(f"candidate id {candidate_id!r} is empty")
    _check_length("candidate id", candidate_id)
    _printed_once("candidate id", candidate_id, hint)
    if candidate_id in NAMED_STREAMS:
        raise InputError(
            f"candidate id {candidate_id!r} is reserved: `{LEDGER_STREAM}` and `{SEALS_STREAM}` name the ledger's "
            f"own streams (log --stream, Ledger.events), so that candidate's events could not be told apart ({hint})"
        )
    if candidate_id.startswith(CANDIDATE_PREFIX):
        raise InputError(
            f"candidate id {candidate_id!r} starts with {CANDIDATE_PREFIX!r}, the prefix of every candidate's "
            f"stream id: it would read as another candidate's stream ({hint})"
        )
    return candidate_id


def check_version_text(what: str, value: object) -> str:
    """A version an operator sets is 1..256 printable characters with no leading or trailing whitespace:
    `"eval-v1 "` would print like the `eval-v1` every manifest names while failing every check."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{what} must be a non-empty string, not {value!r}")
    _check_length(what, value)
    if not all(_is_printable(ch) for ch in value):
        raise InputError(f"{what} {value!r} contains control or format characters")
    if value != value.strip():
        raise InputError(f"{what} {value!r} starts or ends with whitespace: no manifest could name it as it prints")
    return value


def check_event_id(event_id: str | None) -> str | None:
    """An idempotency key is a non-empty string printed as no other key is (`_printed_once`); None passes.
    Not ending in `/<digits>`: `run/7/1` would be taken for the second event of the command keyed `run/7`."""
    if event_id is None:
        return None
    if not isinstance(event_id, str) or not event_id:
        raise InputError(f"event id (idempotency key) {event_id!r} must be a non-empty string")
    _printed_once("event id (idempotency key)", event_id, "give the key as it prints, in NFC")
    if _SUB_KEY.search(event_id):
        raise InputError(
            f"event id (idempotency key) {event_id!r} ends with '/<number>': those ids are reserved for the "
            "further events of a command keyed with what comes before it (KEY, KEY/1, KEY/2, ...); "
            "end the key with something else (e.g. run-42/0017/fail-reward)"
        )
    return event_id


def display(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control or format character spelled out (`\\x1b`), safe to print; newlines too
    unless `keep_newlines` (a multi-line report)."""
    if text.isprintable():  # the common case, in C: `str.isprintable` is `_is_printable` for every code point
        return text
    kept = "\n" if keep_newlines else ""
    if all(ch in kept or _is_printable(ch) for ch in text):
        return text
    return "".join(
        ch if ch in kept or _is_printable(ch) else ch.encode("unicode_escape").decode("ascii") for ch in text
    )
