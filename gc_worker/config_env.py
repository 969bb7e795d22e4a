"""The environment: the ``MEMORY_GC_*`` variables that set options, and the runtime's own.

- ``env_layer``: the settings layer of variables of the form ``MEMORY_GC_<SECTION>__<KEY>``
  (e.g. ``MEMORY_GC_DECAY__HALF_LIFE_DAYS=45``; the value is read as a TOML value, falling
  back to a plain string), applied last by gc_worker.config.load_settings. Any other
  ``MEMORY_GC_*`` variable without ``__`` is an error naming the closest option's or runtime
  variable (``did_you_mean``), except Kubernetes' service links for a Service named memory-gc
  (``SERVICE_LINK``), which are passed over.
- ``load_runtime``: where to find things (``RUNTIME_ENV``): ``MEMORY_GC_DATABASE_URL`` (unset:
  the embedded server), ``MEMORY_GC_DATA_DIR`` (unset: ``default_data_dir()``),
  ``MEMORY_GC_CONFIG``, ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` (an http(s) URL with a host,
  refused at start-up otherwise). The database URL or data folder set but empty is refused,
  never read as unset.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gc_worker.config_sections import Runtime, Settings
from gc_worker.errors import ConfigError

ENV_PREFIX = "MEMORY_GC_"
RUNTIME_ENV = {"DATABASE_URL", "DATA_DIR", "CONFIG", "LOG_LEVEL"}
# What Kubernetes sets in every pod for a Service named memory-gc (or memory-gc-…), e.g.
# MEMORY_GC_SERVICE_HOST, MEMORY_GC_PORT_9108_TCP_ADDR: not options, and not typos of one
SERVICE_LINK = re.compile(
    r"(?:[A-Z0-9_]+_)?(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)"
)


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memory-gc"


def load_runtime(env: Mapping[str, str] | None = None) -> Runtime:
    env = os.environ if env is None else env
    data_dir = env.get(ENV_PREFIX + "DATA_DIR")
    if data_dir is not None and not data_dir.strip():  # would silently mean another store
        raise ConfigError(
            f"{ENV_PREFIX}DATA_DIR is set but empty (an unset secret or variable?); name the "
            f"folder of the embedded server, or unset it to use {default_data_dir()}"
        )
    base_url = env.get("OPENAI_BASE_URL", "").strip() or None  # a secret file's newline
    if base_url is not None:
        _check_base_url(base_url)
    database_url = env.get(ENV_PREFIX + "DATABASE_URL")
    if database_url is not None and not database_url.strip():
        raise ConfigError(
            f"{ENV_PREFIX}DATABASE_URL is set but empty (an unset secret or variable?); set it "
            "to the store's URL, or unset it to use the embedded server"
        )
    return Runtime(
        database_url=database_url.strip() if database_url else None,
        data_dir=Path(data_dir) if data_dir else default_data_dir(),
        config_path=Path(env[ENV_PREFIX + "CONFIG"]) if env.get(ENV_PREFIX + "CONFIG") else None,
        openai_api_key=env.get("OPENAI_API_KEY", "").strip() or None,
        openai_base_url=base_url,
    )


def _check_base_url(url: str) -> None:
    """A mistyped endpoint is refused at start-up: every model call would fail, and the run
    would defer every model decision night after night as if no model were configured. The
    message shows scheme, host and port only (the URL may carry a key)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # an unclosed or invalid [IPv6] host: urlsplit refuses it
        parts, host = urlsplit(""), None
    shown = f"{parts.scheme}://{host}" if host else "it"
    if parts.scheme.lower() not in ("http", "https") or not host:
        problem = "is not an http(s) URL with a host"
    elif any(c.isspace() or not c.isprintable() for c in url):
        problem = f"({shown}) contains a space or a control character"
    else:
        try:
            bad_port = parts.port == 0  # ValueError for one that is not a number in 0-65535
        except ValueError:
            bad_port = True
        problem = f"({shown}) has a port that is not 1-65535" if bad_port else None
    if problem is not None:
        raise ConfigError(
            f"OPENAI_BASE_URL {problem}; use e.g. https://api.openai.com/v1 or "
            "http://localhost:8000/v1, or unset it to run offline"
        )


def env_layer(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    layer: dict[str, dict[str, Any]] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name[len(ENV_PREFIX) :] in RUNTIME_ENV:
            continue
        rest = name[len(ENV_PREFIX) :]
        if "__" not in rest:
            if _service_link(rest, raw):
                continue
            options = [ENV_PREFIX + n for n in sorted(RUNTIME_ENV)]
            meant = difflib.get_close_matches(name, options + _option_variables(), 1, 0.8)
            raise ConfigError(
                f"unknown variable {name}{did_you_mean(name, meant or options)}; options are "
                f"{ENV_PREFIX}<SECTION>__<KEY>, e.g. MEMORY_GC_DECAY__HALF_LIFE_DAYS"
            )
        section, key = rest.lower().split("__", 1)
        layer.setdefault(section, {})[key] = _parse_env_value(raw)
    return layer


def _service_link(name: str, value: str) -> bool:
    """Whether MEMORY_GC_``name`` = ``value`` is one of Kubernetes' service links. Their
    <SERVICE>_PORT is a URL (tcp://10.96.0.12:9108): a bare number there is someone's
    mistyped option (MEMORY_GC_DATABASE_PORT=5433), still refused."""
    if not SERVICE_LINK.fullmatch(name):
        return False
    if name == "PORT" or (name.endswith("_PORT") and "SERVICE_PORT" not in name
                          and not re.search(r"(?:^|_)PORT_[0-9]+_[A-Z]+_PORT$", name)):  # fmt: skip
        return re.fullmatch(r"(?:tcp|udp|sctp)://\S+", value) is not None
    return True


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _option_variables() -> list[str]:
    """Every option's variable (MEMORY_GC_DECAY__HALF_LIFE_DAYS, …): what a variable with one
    underscore between section and key most likely meant."""
    return [
        f"{ENV_PREFIX}{section.upper()}__{key.upper()}"
        for section, field in Settings.model_fields.items()
        for key in field.annotation.model_fields  # type: ignore[union-attr]
    ]


def did_you_mean(word: str, options: list[str]) -> str:
    """The hint for a mistyped name: the closest of ``options``, else all of them."""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean `{close[0]}`?)" if close else f" (valid: {', '.join(options)})"
