"""``quotas.pacing`` (kafka | strict): read by the live quotas, the shadow and the replays
alike; what strict pacing cannot hold is refused at the key that has to change."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.loading import parse_config, parse_quotas
from kafka_quota_proxy.config.summary import summarize
from testkit import config_errors

SOURCE = "pacing.yaml"
BASE = config_errors.BASE
# line 7 quotas:, 8 pacing, 9 entities:, 10 the entity
QUOTAS = """\
quotas:
  pacing: {pacing}
  entities:
    - {{client-id: app, producer_byte_rate: 1000000}}
"""


def test_kafka_by_default_strict_when_asked_and_carried_to_the_replays() -> None:
    assert parse_config(BASE, SOURCE).quotas.settings().pacing == "kafka"
    cfg = parse_config(BASE + QUOTAS.format(pacing="strict"), SOURCE)
    assert cfg.quotas.settings().pacing == "strict"
    # (the capture writes the section as dumped; the replays read it back)
    from kafka_quota_proxy.quota.replay import settings_from_section

    dumped = cfg.quotas.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert settings_from_section(dumped) == cfg.quotas.settings()
    # a quota-only file (quotas simulate) reads it too
    assert parse_quotas(QUOTAS.format(pacing="strict"), SOURCE).settings().pacing == "strict"


def test_a_shadow_may_pace_otherwise_than_the_live_quotas() -> None:
    text = BASE + QUOTAS.format(pacing="kafka") + (
        "  shadow:\n    pacing: strict\n"
        "    entities: [{client-id: app, producer_byte_rate: 1000000}]\n")
    cfg = parse_config(text, SOURCE)
    shadow = cfg.quotas.shadow_settings()
    assert shadow is not None and shadow.pacing == "strict"
    # check-config's summary says which
    summary = summarize(cfg)
    assert "quota entities     : 1 (window 11 x 1 s)" in summary
    assert "shadow quotas      : 1 entities (window 11 x 1 s, strict pacing)" in summary


def test_an_unknown_pacing_names_its_line() -> None:
    e = config_errors.single_error(BASE + QUOTAS.format(pacing="exact"), SOURCE)
    assert (e["line"], e["path"]) == (8, "quotas.pacing"), e
    assert "kafka" in str(e["msg"]) and "strict" in str(e["msg"])


@pytest.mark.parametrize(("extra", "line", "path", "words"), [
    ("  cap_byte_rate_throttle: true\n", 11, "quotas.cap_byte_rate_throttle",
     "cannot: set cap_byte_rate_throttle: false"),
])
def test_what_strict_pacing_cannot_hold_is_refused(extra: str, line: int, path: str,
                                                   words: str) -> None:
    e = config_errors.single_error(BASE + QUOTAS.format(pacing="strict") + extra, SOURCE)
    assert (e["line"], e["path"]) == (line, path), e
    assert words in str(e["msg"]), e


@pytest.mark.parametrize("extra", [
    "workers: 2\ncoordination: {enabled: false}\n",
    "workers: 2\n",  # (coordination auto: budgets shared by the workers)
    "coordination: {enabled: true}\n",
])
def test_strict_pacing_loads_alone_or_with_shared_budgets(extra: str) -> None:
    text = BASE + QUOTAS.format(pacing="strict") + extra
    assert parse_config(text, SOURCE).quotas.settings().pacing == "strict"
