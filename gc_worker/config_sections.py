"""The settings classes: one frozen pydantic ``Section`` per ``[section]`` of the TOML file,
``Settings`` holding them all, and ``Runtime`` (where to find things, from the environment).

Each class declares its options with their defaults and bounds (mirrored, with a reason per
option, in ``config/default.toml``); validators refuse what the bounds cannot say (a cron line
that never fires, an unknown time zone, true/false for a number, an empty model name).
Loading them from the TOML file and ``MEMORY_GC_*`` variables (whose layer is
``gc_worker.config_env``'s), and the messages naming a bad value, are ``gc_worker.config``'s,
which re-exports every name here: import them from there.
"""

from __future__ import annotations

import typing
import zoneinfo
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# Day windows are subtracted from the run's clock: 100 years is "forever" in practice, and a
# window reaching before year 1 would crash every run with OverflowError.
MAX_DAYS = 36_500


class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_switch_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """true/false for a number is a mistake, not 1/0: `retention_days = false` meant as
        "off" would purge every soft-deleted row at the next run."""
        items = value if isinstance(value, list | tuple) else (value,)
        if any(isinstance(v, bool) for v in items) and _numeric(
            cls.model_fields[info.field_name].annotation
        ):
            raise ValueError("expected a number, not true/false")
        return value


def _numeric(annotation: Any) -> bool:
    """Whether a setting declared ``annotation`` holds numbers (int, float, a tuple of them)."""
    if annotation in (int, float):
        return True
    return any(_numeric(arg) for arg in typing.get_args(annotation))


class JobSection(Section):
    enabled: bool = True


class RunSettings(Section):
    batch_users: int = Field(500, ge=1, le=100_000)
    workers: int = Field(2, ge=1, le=8)
    lease_seconds: int = Field(300, ge=10, le=86_400)
    max_actions_per_statement: int = Field(10_000, ge=100, le=1_000_000)
    skip_idle_users: bool = True
    # a run over every user refreshes decay scores in one pass over the table after its batches
    # (gc_worker.score_pass); false: each batch refreshes its users' scores
    score_pass: bool = True
    # an older plan is refused by `apply`: its changes carry the plan's instant (retention and
    # the read rule's history would be off by its age) and the store has moved on since
    max_plan_age_hours: float = Field(72, gt=0, le=24 * 366)


class ScheduleSettings(Section):
    cron: str = "0 3 * * *"
    timezone: str = "UTC"
    misfire_grace_seconds: int = Field(3600, ge=1, le=MAX_DAYS * 86_400)
    mode: Literal["plan_and_apply", "plan_then_apply"] = "plan_and_apply"
    apply_delay_minutes: int = Field(60, ge=0, le=MAX_DAYS * 1440)
    # plan_then_apply: a plan retiring more than this share of the active memories, and at
    # least hold_min_rows of them, is held for a person (`memory-gc apply` / `reject`); 1: never
    hold_above_share: float = Field(0.25, ge=0, le=1)
    hold_min_rows: int = Field(1000, ge=0, le=10**12)
    poll_seconds: float = Field(2.0, gt=0, le=300)

    # checked when the settings load, not when `schedule` first starts: a typo in the cron line
    # must not wait for the night to surface
    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str) -> str:
        from gc_worker.scheduler import cron_trigger

        cron_trigger(value, "UTC")  # its ValueError says what is wrong
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone_exists(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError('no such IANA time zone; use e.g. "UTC" or "Europe/Berlin"') from None
        return value


class TTLExpirySettings(JobSection):
    pass


class ImportanceSettings(JobSection):
    batch_size: int = Field(20, ge=1, le=200)


class DecaySettings(JobSection):
    # bounds far past any sensible value (stored plans keep validating), within which
    # age / (half-life × multiplier) stays a finite float8 in SQL
    half_life_days: float = Field(30.0, ge=1e-6, le=10**12)
    importance_multipliers: tuple[float, float, float, float, float] = (0.5, 0.75, 1.0, 2.0, 4.0)
    forget_below: float = Field(0.05, ge=0, le=1)
    forget_max_importance: int = Field(2, ge=0, le=5)
    grace_days: float = Field(14, ge=0, le=MAX_DAYS)
    epsilon: float = Field(0.01, ge=0, le=1)

    @field_validator("importance_multipliers")
    @classmethod
    def _multipliers_in_range(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not all(1e-6 <= m <= 1e12 for m in value):
            raise ValueError("each multiplier must be between 1e-6 and 1e12")
        return value


class ContradictionSettings(JobSection):
    similarity: float = Field(0.75, gt=0, le=1)
    max_pairs_per_memory: int = Field(3, ge=1, le=100)


class CompactionSettings(JobSection):
    similarity: float = Field(0.85, gt=0, le=1)
    max_group_size: int = Field(8, ge=2, le=100)
    max_merge_depth: int = Field(1, ge=0, le=10)


class UsagePruneSettings(JobSection):
    unused_days: float = Field(90, gt=0, le=MAX_DAYS)
    grace_days: float = Field(14, ge=0, le=MAX_DAYS)
    max_importance: int = Field(3, ge=0, le=5)


class UserCapSettings(JobSection):
    max_memories: int = Field(500, ge=1, le=10**12)
    overflow: Literal["evict", "summarize"] = "evict"
    fallback_to_evict: bool = False
    max_summary_depth: int = Field(1, ge=0, le=10)
    max_summary_rows: int = Field(20, ge=2, le=1000)
    max_summaries_per_user: int = Field(10, ge=1, le=1000)


class HardDeleteSettings(JobSection):
    retention_days: float = Field(30, ge=0, le=MAX_DAYS)
    history_retention_days: float = Field(365, ge=0, le=MAX_DAYS)


class ErasureSettings(JobSection):
    retention_days: float = Field(1, ge=0, le=MAX_DAYS)


class HistorySettings(Section):
    """The worker's own audit (gc_worker.history): runs that ended this long ago go, except
    what is still needed (a link erasure follows, a change still restorable). ``enabled =
    false``: never pruned."""

    enabled: bool = True
    retention_days: float = Field(400, ge=1, le=MAX_DAYS)


class LLMSettings(Section):
    model: str = "gpt-4.1-mini"
    max_calls_per_run: int = Field(500, ge=0, le=10**15)
    max_tokens_per_run: int = Field(2_000_000, ge=0, le=10**15)
    timeout_seconds: float = Field(30.0, gt=0, le=86_400)
    max_retries: int = Field(3, ge=0, le=10)
    outage_pause_seconds: float = Field(300.0, ge=0, le=86_400)
    # None (not set): not sent, as some OpenAI-compatible servers refuse the parameter
    max_completion_tokens: int | None = Field(None, ge=1, le=10**9)

    @field_validator("model")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():  # every call would be refused: each decision deferred, nightly
            raise ValueError("names no model; set e.g. gpt-4.1-mini")
        return value


class EmbeddingSettings(Section):
    dim: int = Field(1536, ge=1, le=16_000)
    model: str = "text-embedding-3-small"


class Settings(Section):
    """Every option memory-gc reads; built once by :func:`load_settings`."""

    run: RunSettings = RunSettings()
    schedule: ScheduleSettings = ScheduleSettings()
    erasure: ErasureSettings = ErasureSettings()
    ttl_expiry: TTLExpirySettings = TTLExpirySettings()
    importance: ImportanceSettings = ImportanceSettings()
    decay: DecaySettings = DecaySettings()
    contradiction: ContradictionSettings = ContradictionSettings()
    compaction: CompactionSettings = CompactionSettings()
    usage_prune: UsagePruneSettings = UsagePruneSettings()
    user_cap: UserCapSettings = UserCapSettings()
    hard_delete: HardDeleteSettings = HardDeleteSettings()
    history: HistorySettings = HistorySettings()
    llm: LLMSettings = LLMSettings()
    embeddings: EmbeddingSettings = EmbeddingSettings()

    @property
    def plan_age_limit_hours(self) -> float:
        """How old a plan may be when applied: run.max_plan_age_hours, and never less than a
        plan_then_apply review window (schedule.apply_delay_minutes) plus an hour for the
        upkeep: a review window the operator chose is never cut short by the limit."""
        if self.schedule.mode != "plan_then_apply":
            return self.run.max_plan_age_hours
        return max(self.run.max_plan_age_hours, (self.schedule.apply_delay_minutes + 60) / 60)

    @property
    def history_minimum_days(self) -> float:
        """The shortest ``history.retention_days`` allowed: the longest retention after which a
        change is still restorable or its row still stored (hard_delete's two, erasure's), plus
        how old a plan may be when applied (its audit rows are written then)."""
        longest = max(
            self.hard_delete.retention_days,
            self.hard_delete.history_retention_days,
            self.erasure.retention_days,
        )
        return longest + self.plan_age_limit_hours / 24


class Runtime(Section):
    """Where to find things: not tunables, so not in the TOML file."""

    database_url: str | None = None
    data_dir: Path
    config_path: Path | None = None
    openai_api_key: str | None = None
    openai_base_url: str | None = None

    @property
    def llm_configured(self) -> bool:
        return bool(self.openai_api_key or self.openai_base_url)
