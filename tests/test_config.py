"""Configuration: defaults, file and environment layers, and errors that say how to fix them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gc_worker.config import Settings, load_settings
from gc_worker.errors import ConfigError

DEFAULT_TOML = Path(__file__).parent.parent / "config" / "default.toml"


class TestDefaults:
    def test_default_toml_matches_built_in_defaults(self):
        """config/default.toml documents exactly the defaults the code uses, every one; an
        option unset by default (TOML has no null) as a commented-out line of its section."""
        text = DEFAULT_TOML.read_text()
        documented = tomllib.loads(text)
        assert load_settings(DEFAULT_TOML, env={}) == Settings()
        built_in = Settings().model_dump()
        unset = {(s, k) for s, v in built_in.items() for k, d in v.items() if d is None}
        for section, key in unset:
            body = text.split(f"[{section}]\n", 1)[1].split("\n[", 1)[0]
            assert f"\n# {key} = " in f"\n{body}", f"{section}.{key} is not documented"
        assert {s: set(v) | {k for t, k in unset if t == s} for s, v in documented.items()} == {
            s: set(v) for s, v in built_in.items()
        }

    def test_every_job_section_takes_enabled(self):
        """Each job's section has an `enabled` switch."""
        import jobs

        for name in jobs.ORDER:
            assert "enabled" in Settings.model_fields[name].annotation.model_fields


class TestLayers:
    def test_file_then_environment(self, tmp_path):
        """The environment overrides the file, which overrides the defaults."""
        path = tmp_path / "gc.toml"
        path.write_text("[decay]\nhalf_life_days = 45\ngrace_days = 3\n")
        settings = load_settings(path, env={"MEMORY_GC_DECAY__GRACE_DAYS": "7"})
        assert settings.decay.half_life_days == 45
        assert settings.decay.grace_days == 7
        assert settings.decay.forget_below == 0.05

    def test_config_path_from_environment(self, tmp_path):
        """MEMORY_GC_CONFIG names the file when no path is given."""
        path = tmp_path / "gc.toml"
        path.write_text("[user_cap]\nmax_memories = 10\n")
        assert load_settings(env={"MEMORY_GC_CONFIG": str(path)}).user_cap.max_memories == 10

    def test_list_value_from_environment(self):
        """A TOML list in a variable is read as a list."""
        env = {"MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS": "[1, 1, 1, 1, 1]"}
        assert load_settings(env=env).decay.importance_multipliers == (1, 1, 1, 1, 1)


class TestErrors:
    def test_unknown_key_names_the_closest(self, tmp_path):
        """An unknown key is refused with the closest valid key."""
        path = tmp_path / "gc.toml"
        path.write_text("[decay]\nhalf_life = 3\n")
        with pytest.raises(ConfigError, match=r"decay\.half_life .*did you mean `half_life_days`"):
            load_settings(path, env={})

    def test_unknown_section_names_the_closest(self):
        """An unknown section from the environment is refused with the closest section."""
        with pytest.raises(ConfigError, match="did you mean `user_cap`"):
            load_settings(env={"MEMORY_GC_USERCAP__MAX_MEMORIES": "3"})

    def test_unknown_plain_variable(self):
        """A MEMORY_GC_ variable that is neither runtime nor SECTION__KEY is refused."""
        with pytest.raises(ConfigError, match="MEMORY_GC_DATABASE_URL"):
            load_settings(env={"MEMORY_GC_DATABASE_ULR": "x"})

    def test_an_option_with_one_underscore_names_the_option(self):
        """MEMORY_GC_DECAY_HALF_LIFE_DAYS (one underscore between section and key) was
        answered "did you mean `MEMORY_GC_DATA_DIR`?": the closest runtime variable, not the
        option meant (found by an operator walkthrough). The options are candidates too."""
        with pytest.raises(ConfigError, match="did you mean `MEMORY_GC_DECAY__HALF_LIFE_DAYS`"):
            load_settings(env={"MEMORY_GC_DECAY_HALF_LIFE_DAYS": "45"})
        with pytest.raises(ConfigError, match="did you mean `MEMORY_GC_USER_CAP__MAX_MEMORIES`"):
            load_settings(env={"MEMORY_GC_USER_CAP_MAX_MEMORIES": "45"})

    def test_a_list_option_not_written_as_a_list_says_how(self):
        """MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS=1,2,3,4,5 (not a TOML list) was answered
        "Input should be a valid tuple (allowed: tuple)": it now says it takes a list of five
        numbers, written as TOML writes one."""
        env = {"MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS": "1,2,3,4,5"}
        with pytest.raises(ConfigError, match=r"a list of exactly 5 numbers, e\.g\. \[0\.5,"):
            load_settings(env=env)

    @pytest.mark.parametrize(
        ("env", "fragment"),
        [
            (
                {"MEMORY_GC_DECAY__HALF_LIFE_DAYS": "0"},
                "(allowed: float >= 1e-06 and <= 1000000000000)",
            ),
            ({"MEMORY_GC_DECAY__FORGET_BELOW": "1.5"}, "(allowed: float >= 0 and <= 1)"),
            ({"MEMORY_GC_RUN__BATCH_USERS": "0"}, "(allowed: int >= 1 and <= 100000)"),
            ({"MEMORY_GC_SCHEDULE__CRON": "61 3 * * *"}, "not a valid cron line"),
            ({"MEMORY_GC_SCHEDULE__CRON": "0 3 * *"}, "five fields"),
            ({"MEMORY_GC_SCHEDULE__CRON": "0 3 30 2 *"}, "never fires"),
            ({"MEMORY_GC_SCHEDULE__CRON": "0 3 31 4,6,9,11 *"}, "never fires"),
            ({"MEMORY_GC_SCHEDULE__TIMEZONE": "Mars/Olympus"}, "no such IANA time zone"),
            ({"MEMORY_GC_USER_CAP__OVERFLOW": "squash"}, "'evict' or 'summarize'"),
            ({"MEMORY_GC_RUN__BATCH_USERS": "many"}, "valid integer"),
            ({"MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS": "[1, 2]"}, "importance_multipliers"),
        ],
    )
    def test_bad_value_names_key_and_range(self, env, fragment):
        """A bad value names the key, the allowed range and the variable to fix."""
        with pytest.raises(ConfigError) as info:
            load_settings(env=env)
        (name,) = env
        assert fragment in str(info.value)
        assert name in str(info.value) or "importance_multipliers" in str(info.value)

    def test_the_half_of_an_either_line_that_never_fires_is_dropped(self):
        """`0 3 31 2 mon` fires every Monday of February (crontab: day or weekday). Its day
        half never fires, and asking it for a fire time searched to year 9999 (about a
        second) at every slot: only the weekday half is kept."""
        from datetime import UTC, datetime

        from gc_worker.scheduler import cron_trigger

        trigger = cron_trigger("0 3 31 2 mon", "UTC")
        assert len(trigger.triggers) == 1
        fire = trigger.get_next_fire_time(None, datetime(2026, 12, 2, tzinfo=UTC))
        assert fire == datetime(2027, 2, 1, 3, tzinfo=UTC)  # the first Monday of February

    @pytest.mark.parametrize("cron", ["0 3 29 2 *", "0 3 30 2 1", "0 3 31 * *"])
    def test_a_cron_that_fires_rarely_is_kept(self, cron):
        """A leap day, a day that does not exist but with a weekday (crontab fires on either),
        the 31st: each fires some day, so each loads."""
        assert load_settings(env={"MEMORY_GC_SCHEDULE__CRON": cron}).schedule.cron == cron

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("MEMORY_GC_HARD_DELETE__RETENTION_DAYS", "false"),
            ("MEMORY_GC_USER_CAP__MAX_MEMORIES", "true"),
            ("MEMORY_GC_DECAY__FORGET_BELOW", "true"),
            ("MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS", "[1, 1, true, 2, 4]"),
        ],
    )
    def test_a_switch_for_a_number_is_refused(self, name, value):
        """true/false for a number was read as 1/0: `retention_days = false`, meant as "off",
        purged every soft-deleted row at the next run."""
        with pytest.raises(ConfigError, match=f"{name}$") as info:
            load_settings(env={name: value})
        assert "expected a number, not true/false" in str(info.value)

    def test_a_switch_stays_a_switch(self, tmp_path):
        """On/off options still take true/false, from the file and the environment."""
        path = tmp_path / "gc.toml"
        path.write_text("[run]\nskip_idle_users = false\n")
        settings = load_settings(path, env={"MEMORY_GC_DECAY__ENABLED": "false"})
        assert not settings.run.skip_idle_users and not settings.decay.enabled

    def test_kubernetes_service_links_are_not_options(self):
        """A Service named memory-gc (or memory-gc-metrics) puts these in every pod: they made
        every command exit 2, a crash-looping daemon. A typo still is an error."""
        links = {
            "MEMORY_GC_SERVICE_HOST": "10.96.0.12",
            "MEMORY_GC_SERVICE_PORT": "9108",
            "MEMORY_GC_SERVICE_PORT_METRICS": "9108",
            "MEMORY_GC_PORT": "tcp://10.96.0.12:9108",
            "MEMORY_GC_PORT_9108_TCP": "tcp://10.96.0.12:9108",
            "MEMORY_GC_PORT_9108_TCP_PROTO": "tcp",
            "MEMORY_GC_PORT_9108_TCP_PORT": "9108",
            "MEMORY_GC_PORT_9108_TCP_ADDR": "10.96.0.12",
            "MEMORY_GC_METRICS_SERVICE_HOST": "10.96.0.13",
        }
        assert load_settings(env=links) == Settings()
        assert load_settings(env={"MEMORY_GC_METRICS_PORT": "tcp://10.96.0.13:9108"}) == Settings()
        with pytest.raises(ConfigError, match="MEMORY_GC_DATABASE_URL"):
            load_settings(env=links | {"MEMORY_GC_DATABASE_ULR": "x"})
        for mistyped in ("MEMORY_GC_DATABASE_PORT", "MEMORY_GC_PORT"):  # a number: not a link
            with pytest.raises(ConfigError, match=mistyped):
                load_settings(env={mistyped: "5433"})

    def test_broken_toml(self, tmp_path):
        """A file that is not TOML is refused with the parser's position."""
        path = tmp_path / "gc.toml"
        path.write_text("[decay\n")
        with pytest.raises(ConfigError, match="not valid TOML"):
            load_settings(path, env={})

    def test_missing_file(self, tmp_path):
        """A missing config file is named."""
        with pytest.raises(ConfigError, match="does not exist"):
            load_settings(tmp_path / "nope.toml", env={})


@pytest.mark.parametrize(
    ("key", "edge"),
    [
        ("SCHEDULE__MISFIRE_GRACE_SECONDS", 36_500 * 86_400),
        ("SCHEDULE__APPLY_DELAY_MINUTES", 36_500 * 1440),
        ("USER_CAP__MAX_MEMORIES", 10**12),
        ("LLM__MAX_CALLS_PER_RUN", 10**15),
        ("LLM__MAX_TOKENS_PER_RUN", 10**15),
        ("LLM__TIMEOUT_SECONDS", 86_400),
    ],
)
def test_upper_bounds_just_inside_and_just_outside(key, edge):
    """The upper bounds the ninth session added (values past them failed at run time with
    exit 1): the edge loads, one past it is a ConfigError naming the key."""
    name = "MEMORY_GC_" + key
    section, field = key.lower().split("__")
    assert getattr(getattr(load_settings(env={name: str(edge)}), section), field) == edge
    with pytest.raises(ConfigError, match=field):
        load_settings(env={name: str(edge + 1)})
