"""How a report's values become text for people: a text from the store (``Stored``) is shown,
never interpreted; every value is put on one line with its control and bidi characters shown as
� (``printable``); numbers get thousands separators, memory ids are shortened to 8 characters,
user ids longer than USER_ID_CHARS to their start, "…" and a hash (``display_id``),
contents and detail values are clipped to PREVIEW_CHARS, a run's error to ERROR_CHARS
(``error_text``), long lists end "… and N more".
The Markdown and HTML renderers escape what these return, each for its own format.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PREVIEW_CHARS = 120
USER_ID_CHARS = 60  # a longer user id is shown as its first _ID_HEAD characters, "…", a hash
_ID_HEAD = 48
# a run's error in a report's header: what stored_error keeps of one error (gc_worker.db); a
# run that failed with several batches names five, and an older run's may be a whole exception
ERROR_CHARS = 300

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_LIST_KEYS = ("content", "memory_ids")  # details shown in their own columns
# What must not reach a person's terminal or viewer from the store: control characters (ESC
# sequences drive a terminal; NUL, BEL; DEL and the C1 set, \x9b being a one-byte CSI) and the
# bidi controls that reorder what is shown (marks, embeddings, overrides, isolates).
_NOT_C0 = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNPRINTABLE = re.compile(rf"[\x00-\x1f{_NOT_C0}]")
# Those json.dumps leaves raw (it escapes the C0 controls only; its own newlines are layout).
RAW_IN_JSON = re.compile(rf"[{_NOT_C0}]")


class Stored(str):
    """A text from the store (memory content, a user id, a detail value): shown, never
    interpreted — Markdown escapes its punctuation too."""


def printable(text: str) -> str:
    """``text`` on one line, whitespace collapsed, control and bidi characters shown as �."""
    return _UNPRINTABLE.sub("\ufffd", " ".join(text.split()))


def display_id(user_id: str) -> str:
    """A user id as people read it: whole up to USER_ID_CHARS characters; a longer one (an
    application may use 300-character ids) as its first _ID_HEAD characters, cut between
    characters as shown (``_cluster_cut``), "…" and 8 hex digits of its SHA-256, so that ids
    with the same start stay apart. An id holding "…" is shown so too, however short: it could
    be another id's shortened form, posing as that user. Display only: the JSON and the store
    keep the id whole."""
    if len(user_id) <= USER_ID_CHARS and "…" not in user_id:
        return user_id
    digest = hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    head = user_id if len(user_id) <= _ID_HEAD else user_id[: _cluster_cut(user_id, _ID_HEAD)]
    return f"{head}…{digest}"


def printable_id(user_id: str) -> str:
    """A user id for a terminal line: shortened (``display_id``), then ``printable``."""
    return printable(display_id(user_id))


def _cluster_cut(text: str, at: int) -> int:
    """The index nearest ``at`` (not after it) that splits no character as shown: not before
    a combining mark, variation selector, emoji modifier or tag, not beside a zero-width
    joiner, not between a flag's two regional indicators. Cheap, not full UAX #29."""
    cut = at
    while cut > 0 and (_extends(text[cut]) or text[cut - 1] == "\u200d"):
        cut -= 1
    if cut > 0 and _is_flag_half(text[cut]):
        start = cut
        while start > 0 and _is_flag_half(text[start - 1]):
            start -= 1
        cut -= (cut - start) % 2
    return cut or at  # one cluster longer than the head: cut it all the same


def _extends(char: str) -> bool:
    code = ord(char)
    return (
        unicodedata.category(char) in ("Mn", "Me", "Mc")
        or code == 0x200D
        or 0x1F3FB <= code <= 0x1F3FF
        or 0xE0020 <= code <= 0xE007F
    )


def _is_flag_half(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return printable(str(value))


def _stored(value: Any) -> Stored | None:
    return None if value is None else Stored(value)


def _user(value: Any) -> Stored | None:
    """A user id for a table or list: shortened if long (``display_id``)."""
    return None if value is None else Stored(display_id(str(value)))


def _counts_text(counts: Mapping[str, int] | None) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in (counts or {}).items() if n) or "—"


def _short_id(value: Any) -> str:
    text = _text(value)
    return text[:8] if _UUID.match(text) else text


def _preview(content: Any) -> str:
    if content is None:
        return "—"
    text = " ".join(str(content).split())
    return Stored(text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…")


def error_text(error: Any) -> Stored:
    """A run's error for a report's header: whole up to ERROR_CHARS characters, else its
    start (cut between characters as shown), "…" and its length. Display only: the JSON
    report keeps it whole."""
    text = " ".join(str(error).split())
    if len(text) <= ERROR_CHARS:
        return Stored(text)
    head = text[: _cluster_cut(text, ERROR_CHARS - 1)]
    return Stored(f"{head}… ({len(text):,} characters; the JSON report has it whole)")


def _details_text(details: Mapping[str, Any]) -> str:
    shown = [f"{k}={_clipped(_short_id(v))}" for k, v in details.items() if k not in _LIST_KEYS]
    return Stored(", ".join(shown)) if shown else "—"


def _clipped(text: str) -> str:
    """A detail value cut to the preview length (a merged record holds a whole memory text)."""
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _id_list(ids: Sequence[Any]) -> str:
    return f"{len(ids)}: " + _limited([_short_id(i) for i in ids], 8)


def _limited(items: Iterable[Any], limit: int) -> str:
    items = [str(i) for i in items]
    more = f" … and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _more_note(more: int, what: str) -> str:
    return f"… and {more:,} more {what}" if more else ""
