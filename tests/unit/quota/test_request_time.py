"""What a request costs a request quota (``quota.request_time``): work, never waiting."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.quota.entities import EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaSettings
from kafka_quota_proxy.quota.replay import Recorded, replay, settings_from_section
from kafka_quota_proxy.quota.request_time import (
    DEFAULT_BASE_US,
    DEFAULT_PER_KIB_US,
    MIN_CHARGE_MS,
    RequestTimeModel,
)


def test_the_charge_is_the_proxy_time_plus_the_estimate_from_sizes() -> None:
    model = RequestTimeModel(base_us=50.0, per_kib_us=2.0)
    # 50 us + 2 us per KiB of 3 KiB moved, plus 0.25 ms of the proxy's own time
    assert model.charge_ms(1024, 2048, 0.25) == pytest.approx(0.25 + (50 + 6) / 1000)
    assert model.broker_ms(1024, -1) == pytest.approx((50 + 2) / 1000)  # no response


@given(st.integers(0, 10**8), st.integers(-1, 10**8), st.floats(0, 100))
def test_the_charge_grows_with_work_only(request_bytes: int, response_bytes: int,
                                         proxy_ms: float) -> None:
    model = RequestTimeModel()
    charge = model.charge_ms(request_bytes, response_bytes, proxy_ms)
    assert charge >= proxy_ms + DEFAULT_BASE_US / 1000
    assert model.charge_ms(request_bytes + 1024, response_bytes, proxy_ms) > charge
    assert model.charge_ms(request_bytes, response_bytes, proxy_ms + 1) > charge


@given(st.integers(0, 10**6), st.integers(-1, 10**6), st.sampled_from([0.0, 1e-9, 0.3]))
def test_an_answered_request_is_never_charged_exactly_0(request_bytes: int, response_bytes: int,
                                                       proxy_ms: float) -> None:
    # (a capture's 0 reads as "not recorded": a replay would estimate it under its own model)
    free = RequestTimeModel(base_us=0.0, per_kib_us=0.0)
    charge = free.charge_ms(request_bytes, response_bytes, proxy_ms)
    assert charge == max(proxy_ms, MIN_CHARGE_MS) and charge > 0


def test_the_config_carries_the_model_to_the_settings_and_the_replays() -> None:
    section = yaml.safe_load("""
request_time: {base_us: 20, per_kib_us: 0.5}
entities: [{client-id: c, request_percentage: 5}]
""")
    settings = QuotasConfig.model_validate(section).settings()
    assert settings.request_time == RequestTimeModel(20.0, 0.5)
    assert settings_from_section(section) == settings
    default = QuotasConfig.model_validate({}).settings().request_time
    assert default == RequestTimeModel(DEFAULT_BASE_US, DEFAULT_PER_KIB_US)


def _rows(duration_us: int, request_time_ms: float) -> list[Recorded]:
    """A consumer's long polls: every 500 ms, each waiting ``duration_us`` on the broker."""
    return [Recorded(i, i * 500, "ANONYMOUS", "c", 1, 120, 80, duration_us, request_time_ms,
                     False, 0) for i in range(60)]


def test_a_replay_never_charges_the_wait_of_a_long_poll() -> None:
    settings = QuotaSettings(samples=11, window_ms=1000,
                             entities={EntityKey(None, "c"): {QuotaType.REQUEST: 1.0}})
    # Captures before schema v3 hold 0 where no request quota was configured: the estimate
    # is charged, not the 500 ms each long poll waited (which would be 100% of a thread).
    assert not any(t.request_ms for t in replay(_rows(500_000, 0.0), settings))
    # A request time recorded by the proxy is replayed as recorded.
    assert any(t.request_ms for t in replay(_rows(500_000, 20.0), settings))


def test_the_model_is_validated_with_the_field_named() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"request_time\.base_us"):
        QuotasConfig.model_validate({"request_time": {"base_us": -1}})
    with pytest.raises(ValidationError, match=r"request_time\.per_kib"):
        QuotasConfig.model_validate({"request_time": {"per_kib": 1}})
