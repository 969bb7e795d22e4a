"""What the worker keeps of a server's error: what an operator needs, none of a row's values.

Everything the worker says about a failure outside its audit — log lines, the CLI's stderr,
``gc_runs.error``, ``gc_run_batches.error``, ``gc_sweep_requests.error`` — is built here from the
driver's diagnostics, so that no memory text, metadata value or embedding reaches a place an
erasure could not follow it to:

- the server's own message, with the values it quotes withheld where it quotes them: a data
  exception (class 22: ``invalid input syntax for type integer: "…"``, a metadata value cast in
  a CHECK) keeps only the quoted names the diagnostics name as identifiers, and no byte dump;
- a message an application's code wrote (a trigger's ``RAISE`` or ``ASSERT``, whatever its
  SQLSTATE; any other procedural language's function; not the worker's own ``memory_gc_*``) is
  withheld whole: it is the application's text and can quote ``NEW.content``. The function
  that raised it is named;
- ``DETAIL`` is cut to what names rather than quotes: a unique or foreign key's columns
  (``key (user_id, content)``), a CHECK's failing row's leading id (``failing row (ID, …)``);
- always the SQLSTATE, and the ids (UUIDs) a withheld message named: ids carry no content, and
  ``forget`` removes erased ones from these columns (``erasure_scrub_error_ids``).
"""

from __future__ import annotations

import re
from typing import Any

OWN_FUNCTION = "memory_gc_"
MAX_IDS = 3  # a batch's error is cut at 300 characters: no id is cut in half
QUOTED = re.compile(r'"((?:[^"]|"")*)"')
BYTES = re.compile(r"0x[0-9a-fA-F]{2}(?: 0x[0-9a-fA-F]{2})*")
UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
UUID_TEXT = re.compile(rf"\b{UUID}\b")
# the innermost frame of CONTEXT: `PL/pgSQL function app_guard() line 3 at RAISE`
FUNCTION_FRAME = re.compile(r"^(PL/\w+|SQL) function \"?([^\s\"(]+)\"?(\([^)]*\))?(.*)$")
FAILING_ROW = re.compile(rf"^Failing row contains \(({UUID})[,)]")
KEY_COLUMNS = re.compile(r"^Key \(([^)]*)\)=")


def server_message(error: Any) -> str:
    """One line about a driver error, without the values of the row it was about."""
    diag = getattr(error, "diag", None)
    state = getattr(error, "sqlstate", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if not state or primary is None:  # the driver's own (a connection refused): no row in it
        return (str(error).splitlines() or [""])[0]
    notes = [f"SQLSTATE {state}", *_detail_notes(diag)]
    frame = _raising_function(diag)
    if frame is None:
        message = _server_text(primary, diag) if state.startswith("22") else primary
    else:
        message = f"{frame} raised it; its text is withheld (it can quote the row)"
        ids = list(dict.fromkeys(UUID_TEXT.findall(primary)))
        if ids:  # ids carry no content: which rows it was about
            notes.append(
                "names " + ", ".join(ids[:MAX_IDS]) + (", …" if len(ids) > MAX_IDS else "")
            )
    return f"{message} ({'; '.join(notes)})"


def _raising_function(diag: Any) -> str | None:
    """``app_guard()`` (``… on TABLE`` when the raise names one) when application code, not
    the server, wrote the message: a PL/pgSQL RAISE or ASSERT, or any other procedural
    language's function; None otherwise."""
    frames = (diag.context or "").splitlines()
    match = FUNCTION_FRAME.match(frames[0]) if frames else None
    if match is None:
        return None
    language, name, args, where = match.groups()
    if language == "SQL" or name.startswith(OWN_FUNCTION):
        return None  # a SQL function cannot RAISE; the worker's own never quote a row
    if language == "PL/pgSQL" and not where.rstrip().endswith(("at RAISE", "at ASSERT")):
        return None  # the server's message about a statement inside the function
    table = f" on {diag.table_name}" if diag.table_name else ""
    return f"{name}{args or '()'}{table}"


def _server_text(primary: str, diag: Any) -> str:
    """A data exception's message with the values it quotes (and byte dumps) withheld."""
    names = {
        getattr(diag, field, None)
        for field in (
            "schema_name",
            "table_name",
            "column_name",
            "datatype_name",
            "constraint_name",
        )
    } - {None}

    def keep_names(match: re.Match[str]) -> str:
        return match.group(0) if match.group(1) in names else '"…"'

    return BYTES.sub("0x…", QUOTED.sub(keep_names, primary))


def _detail_notes(diag: Any) -> list[str]:
    detail = (diag.message_detail or "").splitlines()
    first = detail[0] if detail else ""
    if match := KEY_COLUMNS.match(first):
        return [f"key ({match.group(1)})"]
    if match := FAILING_ROW.match(first):
        return [f"failing row ({match.group(1)}, …)"]
    return []
