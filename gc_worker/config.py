"""Settings: one frozen object built at start-up from TOML and ``MEMORY_GC_*`` variables.

Sources, later wins: the built-in defaults (mirrored, with a reason per option, in
``config/default.toml``), the TOML file named by ``MEMORY_GC_CONFIG``, then variables of the
form ``MEMORY_GC_<SECTION>__<KEY>`` (e.g. ``MEMORY_GC_DECAY__HALF_LIFE_DAYS=45``; the value is
read as a TOML value, falling back to a plain string). The variables' layer, and the runtime's
own variables (``load_runtime``), are ``gc_worker.config_env``'s.

Validation happens here, once: an unknown section or key is an error naming the closest valid
one; a bad value names the key, what is allowed and where it was set.

The settings classes themselves (``Settings``, one ``…Settings`` per section, ``Runtime``,
``MAX_DAYS``) are declared in ``gc_worker.config_sections`` and re-exported here: this module
is where they are imported from.
"""

from __future__ import annotations

import math
import os
import tomllib
import typing
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from gc_worker.config_env import ENV_PREFIX, did_you_mean, env_layer
from gc_worker.config_sections import (
    MAX_DAYS,
    CompactionSettings,
    ContradictionSettings,
    DecaySettings,
    EmbeddingSettings,
    ErasureSettings,
    HardDeleteSettings,
    HistorySettings,
    ImportanceSettings,
    JobSection,
    LLMSettings,
    RunSettings,
    Runtime,
    ScheduleSettings,
    Section,
    Settings,
    TTLExpirySettings,
    UsagePruneSettings,
    UserCapSettings,
)
from gc_worker.errors import ConfigError, UsageError

__all__ = [  # this module's, and the settings classes of gc_worker.config_sections
    "AHEAD",
    "MAX_DAYS",
    "NOW_YEARS",
    "CompactionSettings",
    "ContradictionSettings",
    "DecaySettings",
    "EmbeddingSettings",
    "ErasureSettings",
    "HardDeleteSettings",
    "HistorySettings",
    "ImportanceSettings",
    "JobSection",
    "LLMSettings",
    "RunSettings",
    "Runtime",
    "ScheduleSettings",
    "Section",
    "Settings",
    "TTLExpirySettings",
    "UsagePruneSettings",
    "UserCapSettings",
    "ahead_of_clock",
    "check_clock",
    "is_utf8",
    "load_settings",
]

# A run's clock outside these years is a typo, and the cutoffs computed from it would overflow
# (or, far in the past, stamp changes that make retention end at once).
NOW_YEARS = (1971, 9000)
# How far ahead of the machine's clock an applied change may be stamped (clock skew between
# hosts, a run started just before midnight of a typed date). Further ahead, retention windows
# end early: `run --now 2062-…` would purge rows whose real retention has not ended.
AHEAD = timedelta(days=1)


def ahead_of_clock(when: datetime) -> bool:
    """Whether a change stamped ``when`` would be more than AHEAD past this machine's clock."""
    return when > datetime.now(UTC) + AHEAD


def check_clock(now: datetime, label: str) -> None:
    """Refuse ``now`` as a clock that stamps changes (a run's, an erasure's, a restore's …):
    a UsageError "``label`` has no timezone" or "… is outside the years …"."""
    if now.tzinfo is None:
        raise UsageError(f"{label} has no timezone")
    if not NOW_YEARS[0] <= now.year <= NOW_YEARS[1]:
        raise UsageError(
            f"{label} is outside the years {NOW_YEARS[0]}-{NOW_YEARS[1]}; "
            "the cutoffs computed from it would overflow"
        )


def is_utf8(value: str) -> bool:
    """Whether ``value`` can be sent as UTF-8: an argument or variable holding bytes that are not
    (Python keeps them as lone surrogates, e.g. '\\udcff') cannot."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_settings(path: Path | str | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Build the validated settings from an optional TOML file and the environment."""
    env = os.environ if env is None else env
    named_by = "--config" if path is not None else ENV_PREFIX + "CONFIG"
    path = path if path is not None else env.get(ENV_PREFIX + "CONFIG")
    if path is not None and not str(path).strip():  # an unset variable, not "no config"
        raise ConfigError(
            f"{named_by} is set but empty (an unset secret or variable?); name the TOML file, "
            f"or leave {named_by} out to run on the built-in defaults"
        )
    layers: list[tuple[str, dict[str, Any]]] = []
    if path:
        layers.append((str(path), _read_toml(Path(path), named_by)))
    layers.append(("environment", env_layer(env)))
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], str] = {}
    for source, layer in layers:
        _check_keys(layer, source)
        for section, values in layer.items():
            merged.setdefault(section, {}).update(values)
            origin.update({(section, key): source for key in values})
    _check_text(merged, origin)
    return _validate(merged, origin)


def _read_toml(path: Path, named_by: str = ENV_PREFIX + "CONFIG") -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; fix {named_by}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text; fix {named_by}") from None
    except OSError as exc:  # a directory, no permission, …
        raise ConfigError(
            f"config file {path} cannot be read ({exc.strerror or exc}); fix {named_by}"
        ) from None
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(
                f"{path}: `{section}` must be a [section] table, e.g. [{section}] on its own line"
            )
    return data


def _check_keys(layer: Mapping[str, Mapping[str, Any]], source: str) -> None:
    sections = Settings.model_fields
    for section, values in layer.items():
        if section not in sections:
            hint = did_you_mean(section, list(sections))
            raise ConfigError(f"{source}: unknown section [{section}]{hint}")
        keys = sections[section].annotation.model_fields  # type: ignore[union-attr]
        for key in values:
            if key not in keys:
                hint = did_you_mean(key, list(keys))
                raise ConfigError(f"{source}: unknown key {section}.{key}{hint}")


def _check_text(merged: Mapping[str, Mapping[str, Any]], origin: Mapping) -> None:
    """A text value holding NUL (TOML's "\\u0000") or bytes that are not UTF-8 (a variable set
    in a Latin-1 shell) passed validation; every run then failed storing its settings (jsonb
    refuses NUL) or raised a traceback. Named here, with its key and source."""
    for section, values in merged.items():
        for key, value in values.items():
            items = value if isinstance(value, list) else [value]
            texts = [v for v in items if isinstance(v, str)]
            if any("\x00" in v or not is_utf8(v) for v in texts):
                raise ConfigError(
                    f"invalid configuration:\n  {section}.{key} = {value!r} (from "
                    f"{origin.get((section, key), 'defaults')}) holds a NUL character or bytes "
                    f"that are not UTF-8 text; set it to plain text in the config file or "
                    f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
                )


def _validate(merged: dict[str, Any], origin: Mapping[tuple[str, str], str]) -> Settings:
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as exc:
        problems = list(dict.fromkeys(_describe(err, merged, origin) for err in exc.errors()))
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems)) from None
    _check_history_retention(settings, origin)
    return settings


def _check_history_retention(settings: Settings, origin: Mapping[tuple[str, str], str]) -> None:
    """history.retention_days must outlast every retention that keeps a change restorable (and
    the age of a plan still applicable): a shorter one would prune the audit a restore, the read
    rule or an erasure still reads. Names both settings and the minimum."""
    history = settings.history
    minimum = settings.history_minimum_days
    if not history.enabled or history.retention_days >= minimum:
        return
    candidates = {
        "hard_delete.retention_days": settings.hard_delete.retention_days,
        "hard_delete.history_retention_days": settings.hard_delete.history_retention_days,
        "erasure.retention_days": settings.erasure.retention_days,
    }
    longest = max(candidates, key=lambda name: candidates[name])
    where = origin.get(("history", "retention_days"), "defaults")
    raise ConfigError(
        f"invalid configuration:\n  history.retention_days = {history.retention_days:g} (from "
        f"{where}) is shorter than {longest} ({candidates[longest]:g} days) plus "
        f"run.max_plan_age_hours ({settings.plan_age_limit_hours:g} h): the audit of changes "
        f"still restorable would be pruned; set history.retention_days to at least "
        f"{math.ceil(minimum * 1000) / 1000:g} (or MEMORY_GC_HISTORY__RETENTION_DAYS), shorten "
        f"{longest}, or turn pruning off with [history] enabled = false"
    )


def _describe(err: Mapping[str, Any], merged: Mapping[str, Any], origin: Mapping) -> str:
    loc = [str(p) for p in err["loc"]]
    section, key = [*loc, "", ""][:2]
    dotted = ".".join(loc[:2]) if key else section
    value = merged.get(section, {}).get(key, "?") if key else "?"
    where = origin.get((section, key), "defaults")
    env_name = f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
    width = _tuple_width(section, key)
    if err["type"] == "value_error":  # a validator's own message says what is allowed
        problem = err["msg"].removeprefix("Value error, ")
    elif width and (len(loc) > 2 or err["type"] in ("too_short", "too_long", "tuple_type")):
        example = list(_field(section, key).default)  # not "Field required" per slot, nor
        problem = f"expected a list of exactly {width} numbers, e.g. {example}"  # "tuple"
    else:
        problem = err["msg"] + _allowed(section, key)
    return (
        f"{dotted} = {value!r} (from {where}): {problem}; "
        f"set a valid value in the config file or {env_name}"
    )


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _field(section: str, key: str) -> Any:
    """The declaration of setting ``section.key``, or None."""
    model = getattr(Settings.model_fields.get(section), "annotation", None)
    return getattr(model, "model_fields", {}).get(key)


def _tuple_width(section: str, key: str) -> int:
    """How many items a fixed-length tuple setting takes (0 if it is not one)."""
    field = _field(section, key)
    if field is None or typing.get_origin(field.annotation) is not tuple:
        return 0
    args = typing.get_args(field.annotation)
    return 0 if Ellipsis in args else len(args)


def _allowed(section: str, key: str) -> str:
    """What the key accepts, from its declaration: type and bounds, or the choices."""
    field = _field(section, key)
    if field is None:
        return ""
    if typing.get_origin(field.annotation) is Literal:
        return f" (allowed: {' or '.join(repr(c) for c in typing.get_args(field.annotation))})"
    kind = getattr(field.annotation, "__name__", str(field.annotation))
    bounds = [
        f"{symbol} {getattr(rule, name)}"
        for rule in field.metadata
        for name, symbol in _BOUNDS
        if getattr(rule, name, None) is not None
    ]
    return f" (allowed: {kind} {' and '.join(bounds)})" if bounds else f" (allowed: {kind})"
