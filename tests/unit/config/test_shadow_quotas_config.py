"""``quotas.shadow``: a candidate quota config with the live entities' schema (window,
cap_byte_rate_throttle, entities of producer_byte_rate, consumer_byte_rate and
request_percentage), converted to budgets exactly as the live quotas and the replay convert
theirs; what a shadow cannot evaluate is refused at its key, with why."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.config.summary import summarize
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.replay import settings_from_section
from testkit import config_errors

SOURCE = "shadow.yaml"
BASE = config_errors.BASE
# line 7 quotas:, 8 entities:, 9 the live entity, 10 shadow:, 11 window, 12 entities:, 13 ...
QUOTAS = """\
quotas:
  entities:
    - {client-id: app, producer_byte_rate: 1000000}
  shadow:
    window: {samples: 5, size_seconds: 2}
    entities:
"""


def single_error(text: str) -> dict[str, object]:
    return config_errors.single_error(text, SOURCE)


def test_a_shadow_section_is_budgets_as_the_replay_reads_them() -> None:
    text = BASE + QUOTAS + (
        "      - {client-id: app, producer_byte_rate: 200000}\n"
        '      - {user: "<default>", consumer_byte_rate: 300000, request_percentage: 25}\n'
        "    cap_byte_rate_throttle: true\n")
    cfg = parse_config(text, SOURCE)
    shadow = cfg.quotas.shadow_settings()
    assert shadow is not None
    assert shadow == settings_from_section({
        "window": {"samples": 5, "size_seconds": 2}, "cap_byte_rate_throttle": True,
        "entities": [{"client-id": "app", "producer_byte_rate": 200000},
                     {"user": "<default>", "consumer_byte_rate": 300000,
                      "request_percentage": 25}]})
    assert shadow.entities[EntityKey(DEFAULT, None)] == {QuotaType.FETCH: 300000.0,
                                                         QuotaType.REQUEST: 25.0}
    # the live quotas are the section without it
    assert cfg.quotas.settings().entities == {EntityKey(None, "app"): {
        QuotaType.PRODUCE: 1e6}}
    assert cfg.quotas.without_shadow().shadow is None
    assert cfg.quotas.without_shadow().entities == cfg.quotas.entities
    assert "shadow quotas      : 2 entities (window 5 x 2 s)" in summarize(cfg)


def test_absent_or_disabled_is_off() -> None:
    assert parse_config(BASE, SOURCE).quotas.shadow_settings() is None
    cfg = parse_config(BASE + QUOTAS + "      - {client-id: app, producer_byte_rate: 5}\n"
                       "    enabled: false\n", SOURCE)
    assert cfg.quotas.shadow is not None and cfg.quotas.shadow_settings() is None
    assert "shadow quotas      : off (enabled: false; 1 entities" in summarize(cfg)


@pytest.mark.parametrize(("extra", "line", "path", "words"), [
    ("    request_time: {base_us: 10}\n", 14, "quotas.shadow.request_time",
     "measured once, by quotas.request_time"),
    ("    ip_entities: [{ip: 10.0.0.1, connection_creation_rate: 5}]\n", 14,
     "quotas.shadow.ip_entities", "user and client-id quotas only"),
    ("    controller_mutation_window: {samples: 3}\n", 14,
     "quotas.shadow.controller_mutation_window", "request_percentage only"),
    ("    shadow: {entities: []}\n", 14, "quotas.shadow.shadow", "no shadow of its own"),
    ("    watch_seconds: 3\n", 14, "quotas.shadow.watch_seconds", "unknown key"),
])
def test_what_a_shadow_cannot_evaluate_is_refused_at_its_key(
        extra: str, line: int, path: str, words: str) -> None:
    e = single_error(BASE + QUOTAS + "      - {client-id: app, producer_byte_rate: 5}\n"
                     + extra)
    assert (e["line"], e["path"]) == (line, path), e
    assert words in str(e["msg"]), e


def test_entities_are_checked_as_the_live_ones() -> None:
    e = single_error(BASE + QUOTAS + "      - {client-id: app, producer_byte_rate: 5, "
                     "controller_mutation_rate: 3}\n")
    assert (e["line"], e["path"]) == (13, "quotas.shadow.entities.0.controller_mutation_rate"), e
    assert "has no throttle to report" in str(e["msg"])
    e = single_error(BASE + QUOTAS + "      - {client-id: app}\n")
    assert e["path"] == "quotas.shadow.entities.0", e
    assert str(e["msg"]).endswith("consumer_byte_rate, request_percentage"), e
    e = single_error(BASE + QUOTAS + "      - {client-id: app, producer_byte_rate: 0}\n")
    assert e["path"] == "quotas.shadow.entities.0.producer_byte_rate", e
    e = single_error(BASE + QUOTAS + "      - {client-id: app, producer_byte_rate: 5}\n"
                     "      - {client-id: app, consumer_byte_rate: 5}\n")
    assert (e["line"], e["path"]) == (14, "quotas.shadow.entities.1"), e
    assert "already configured at quotas.shadow.entities.0" in str(e["msg"])
    e = single_error(BASE + QUOTAS + "      - {ip: 10.0.0.1, connection_creation_rate: 5}\n")
    assert "names an ip" in str(e["msg"]), e
