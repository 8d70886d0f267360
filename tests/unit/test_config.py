"""RuntimeConfig: every Runtime option validated once, with a named refusal (no database)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._config import RuntimeConfig, RuntimeOptions


class Charge(BaseModel):
    cents: int


class Pay(akter.Actor, execution_timeout=40, lock_wait=3):
    @akter.command
    async def go(self) -> None:
        self.enqueue(Pay.charge, Charge(cents=1))

    @akter.job()
    async def charge(call: akter.JobCall, payload: Charge) -> None:
        return None


class Other(akter.Actor):
    @akter.command
    async def go(self) -> None:
        return None


def test_defaults_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AKTER_DATABASE_URL", raising=False)
    config = RuntimeConfig()
    assert config.database_url is None and config.schema == "akter"
    assert config.window_ms == 24 * 3600 * 1000
    assert (config.pool_size, config.framework_pool_size) == (20, 3)
    assert (config.pool_wait_ms, config.query_pool_wait_ms) == (2000, 2000)
    assert (config.drain_deadline_ms, config.poll_ms, config.max_backoff_ms) == (
        30_000,
        1000,
        256_000,
    )
    assert (config.job_lease_ms, config.cancel_check_ms) == (60_000, 20_000)
    assert (config.singleton_lease_ms, config.clock_offset_ms) == (35_000, 0)
    assert config.claim_lease_ms == 32_000 + 5_000  # no hosted type: the floor
    assert config.executes == frozenset()
    assert config.relay and config.maintenance and config.host_actors and not config.notify


def test_every_option_of_runtime_options_is_a_config_field() -> None:
    fields = set(RuntimeConfig.__dataclass_fields__)
    assert set(RuntimeOptions.__annotations__) <= fields


def test_derived_values_follow_the_hosted_types() -> None:
    definitions = [akter.Runtime([Pay, Other]).definition(t) for t in ("Pay", "Other")]
    config = RuntimeConfig(definitions)
    assert config.claim_lease_ms == 40_000 + 3_000 + 5_000
    assert config.executes == {("Pay", "charge")}
    assert RuntimeConfig(definitions, jobs=[]).executes == frozenset()
    assert RuntimeConfig(definitions, jobs=[Pay.charge]).executes == {("Pay", "charge")}


def test_durations_take_seconds_or_timedeltas_and_round_up_to_milliseconds() -> None:
    config = RuntimeConfig(
        retry_window=timedelta(minutes=5), poll=0.0001, lease=3, cancel_check=timedelta(seconds=1)
    )
    assert (config.window_ms, config.poll_ms, config.job_lease_ms) == (300_000, 1, 3000)
    assert config.cancel_check_ms == 1000


def test_the_url_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AKTER_DATABASE_URL", "postgresql://x/y")
    assert RuntimeConfig().database_url == "postgresql://x/y"
    assert RuntimeConfig(database_url="postgresql://a/b").database_url == "postgresql://a/b"
    assert RuntimeConfig(data_dir="d").data_dir == Path("d")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_window": 0}, "retry_window must be between 1 ms and 30 days"),
        ({"retry_window": timedelta(days=31)}, "retry_window must be between 1 ms and 30 days"),
        ({"max_resident_actors": 0}, "max_resident_actors must be an integer ≥ 1"),
        ({"max_pending_commands": True}, "max_pending_commands must be an integer ≥ 1"),
        ({"pool_size": 2.5}, "pool_size must be an integer ≥ 1"),
        ({"singleton_lease": 0.5}, "singleton_lease must be between 1 s and 1 day"),
        ({"singleton_lease": "35"}, "singleton_lease"),
        ({"clock_offset": timedelta(days=367)}, "clock_offset must be at most 366 days"),
        ({"framework_pool_size": 0}, "framework_pool_size must be an integer from 1 to 100, got 0"),
        ({"query_pool_wait": 3601}, "query_pool_wait must be between 1 ms and 1 hour"),
        ({"pass_limit": 0}, "pass_limit must be an integer from 1 to 1000000"),
        ({"delivery_concurrency": 10**7}, "delivery_concurrency must be an integer from 1"),
        ({"executor_concurrency": None}, "executor_concurrency must be an integer from 1"),
        ({"poll": 0}, "poll must be at least 1 ms"),
        ({"max_backoff": -1}, "must not be negative"),
        ({"claim_lease": float("nan")}, "claim_lease"),
        ({"lease": 2.999}, "lease must be at least 3000 ms"),
        ({"cancel_check": 0.5}, "cancel_check must be at least 1000 ms"),
        ({"lease": 3, "cancel_check": 2}, "cancel_check must be at most a third of the lease"),
        ({"jobs": ["charge"]}, "jobs= takes declared jobs"),
    ],
)
def test_a_bad_option_is_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(akter.ConfigurationError, match=message):
        RuntimeConfig(**options)
    with pytest.raises(akter.ConfigurationError, match=message):
        akter.Runtime(**options)  # the same check, before anything is built


def test_the_first_bad_option_in_documented_order_is_named() -> None:
    with pytest.raises(akter.ConfigurationError, match="pool_size"):
        RuntimeConfig(pool_size=0, lease=1)


def test_an_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="pool_sise"):
        akter.Runtime(pool_sise=3)  # type: ignore[call-arg]


def test_the_config_is_frozen() -> None:
    config = RuntimeConfig()
    with pytest.raises(AttributeError):
        config.pool_size = 3  # type: ignore[misc]
