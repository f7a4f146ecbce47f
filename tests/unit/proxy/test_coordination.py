"""The runtime of shared budgets without a cluster: what a read record does, what a report
tick makes, the fallback's metric, and the config that turns it on."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.schema import CoordinationConfig
from kafka_quota_proxy.proxy.cluster_topics import mac_headers, signed
from kafka_quota_proxy.proxy.features.coordination import Coordination, own_process_id
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.entities import EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaSettings
from kafka_quota_proxy.quota.shared import UsageReport

P = QuotaType.PRODUCE
SETTINGS = QuotaSettings(entities={EntityKey(None, "app"): {P: 1_000_000.0}})


class Clocks:
    def __init__(self) -> None:
        self.mono = 50_000
        self.wall = 1_800_000_000_000


def make(clocks: Clocks, **config: object) -> Coordination:
    enforcer = QuotaEnforcer(SETTINGS)
    return Coordination(CoordinationConfig(**config), enforcer, ["127.0.0.1:9"], "me/0/1-2", 2,
                        clock=lambda: clocks.mono, wall=lambda: clocks.wall)


def other(clocks: Clocks, seq: int, sent_before_ms: int = 0) -> bytes:
    budgets = {(111, P, "", "app"): ((500, 100, 400_000.0),)}
    return UsageReport("other/0/3-4", seq, clocks.wall - sent_before_ms, 11, 1000,
                       budgets).encode()


def test_a_report_read_counts_from_when_it_was_sent_and_a_tombstone_ends_its_liveness(
        ) -> None:
    clocks = Clocks()
    c = make(clocks)
    c._reader_state(True, True)
    c.observe(b"other/0/3-4", other(clocks, 1, sent_before_ms=300), 0)
    # sent 300 ms ago: its sample started 800 ms before now on this clock
    total, oldest = c.remote.others((111, P, "", "app"), clocks.mono)
    assert (total, oldest) == (400_000.0, clocks.mono - 800)
    assert c.reports_read == 1 and c.report_age_ms_max == 300
    assert c.remote.peers(clocks.mono) == ["other/0/3-4"]
    c.observe(b"other/0/3-4", None, 0)  # it stopped cleanly: no longer live, but the bytes
    assert c.remote.peers(clocks.mono) == []  # it passed count until its report is stale
    assert c.remote.others((111, P, "", "app"), clocks.mono)[0] == 400_000.0
    assert c.remote.others((111, P, "", "app"), clocks.mono + 2000) == (0.0, clocks.mono + 2000)


def test_a_report_that_does_not_parse_is_counted_and_changes_nothing() -> None:
    clocks = Clocks()
    c = make(clocks)
    c.observe(b"x", b"\x07garbage", 0)
    assert c.bad_reports == 1 and c.reports_read == 0


def test_an_old_report_is_placed_at_most_the_staleness_back_and_so_is_stale() -> None:
    clocks = Clocks()
    c = make(clocks, staleness_ms=1000, report_ms=250)
    c._reader_state(True, True)
    c.observe(b"other/0/3-4", other(clocks, 1, sent_before_ms=60_000), 0)
    assert c.remote.peers(clocks.mono) == []


def test_fallback_until_the_own_reports_come_back_then_the_metric_says_off() -> None:
    clocks = Clocks()
    c = make(clocks)
    metric = {m.name: m.samples[0].value for m in c.metric_families()}
    assert metric["kafka_proxy_shared_quota_fallback"] == 1  # nothing read yet
    assert metric["kafka_proxy_shared_quota_fallback_processes"] == 2
    c._reader_state(True, True)
    own = UsageReport("me/0/1-2", 1, clocks.wall, 11, 1000, {})
    c.remote.wrote(own)
    c.observe(b"me/0/1-2", own.encode(), 0)
    c._note_fallback()
    metric = {m.name: m.samples[0].value for m in c.metric_families()}
    assert metric["kafka_proxy_shared_quota_fallback"] == 0
    assert c.in_fallback is False
    c._reader_state(False, False)  # the topic gone: fallback again
    assert c.in_fallback is True


def test_the_process_id_names_instance_worker_pid_and_start() -> None:
    import os

    instance, worker, run = own_process_id("zone-a", 3).split("/")
    assert (instance, worker) == ("zone-a", "3") and run.startswith(f"{os.getpid()}-")


def test_staleness_must_cover_two_report_intervals() -> None:
    with pytest.raises(ValueError, match="staleness_ms"):
        CoordinationConfig(report_ms=1000, staleness_ms=1500)


def test_refused_reports_are_counted_by_reason_and_logged_at_most_every_ten_seconds(
        capsys: pytest.CaptureFixture[str]) -> None:
    clocks = Clocks()
    c = make(clocks)
    c._reader_state(True, True)
    forged = UsageReport("forger/0/1-2", 1, clocks.wall + 3_600_000, 11, 1000,
                         {(111, P, "", "app"): ((500, 0, 1e12),)}).encode()
    for _ in range(5):
        c.observe(b"forger/0/1-2", forged, 0)
    c.observe(b"me/0/1-2", UsageReport("me/0/1-2", 7, clocks.wall, 11, 1000, {}).encode(), 0)
    assert c.remote.others((111, P, "", "app"), clocks.mono) == (0.0, clocks.mono)
    families = {m.name: m for m in c.metric_families()}
    refused = {s.labels["reason"]: s.value
               for s in families["kafka_proxy_shared_quota_reports_refused"].samples}
    assert refused["future"] == 5 and refused["own_id"] == 1
    assert capsys.readouterr().out.count("shared_quota_report_refused") == 1
    clocks.wall += 10_000
    c.observe(b"forger/0/1-2", forged, 0)  # (still an hour ahead)
    assert "refused_since_last_log=6" in capsys.readouterr().out


def test_signed_records_only_with_a_secret() -> None:
    """``coordination.secret``: reports not signed with it are refused whoever wrote them;
    tombstones too. (``proxy.cluster_topics``: HMAC-SHA256 over topic, key and value.)"""
    secret = b"a-shared-secret-of-some-length"
    topic, key, value = "__kafka_quota_proxy_usage", b"k", b"v"
    headers = mac_headers(secret, topic, key, value)["headers"]
    assert signed(secret, topic, key, value, headers)
    assert not signed(b"another-secret-of-some-length", topic, key, value, headers)
    assert not signed(secret, topic, key, b"v2", headers)  # tampered
    assert not signed(secret, "other-topic", key, value, headers)  # replayed elsewhere
    assert not signed(secret, topic, key, value, None)
    assert not signed(secret, topic, key, value, headers + headers)  # two: refused
    assert not signed(secret, topic, key, None, headers)  # not a tombstone of it
    assert signed(secret, topic, key, None, mac_headers(secret, topic, key, None)["headers"])
    assert mac_headers(None, topic, key, value) == {}

    clocks = Clocks()
    c = make(clocks, secret="a-shared-secret-of-some-length")
    c._reader_state(True, True)
    sub = c.subscription()
    forged = other(clocks, 1)
    sub.deliver(b"other/0/3-4", forged, 0, None)
    sub.deliver(b"other/0/3-4", forged, 0, mac_headers(b"wrong-secret-xxxxxxxx", sub.topic,
                                                        b"other/0/3-4", forged)["headers"])
    sub.deliver(b"other/0/3-4", None, 0, None)  # an unsigned tombstone
    assert c.remote.peers(clocks.mono) == [] and c.reports_read == 0
    sub.deliver(b"other/0/3-4", forged, 0,
                mac_headers(c.secret, sub.topic, b"other/0/3-4", forged)["headers"])
    assert c.remote.peers(clocks.mono) == ["other/0/3-4"]
    families = {m.name: m for m in c.metric_families()}
    refused = {s.labels["reason"]: s.value
               for s in families["kafka_proxy_shared_quota_reports_refused"].samples}
    assert refused["unsigned"] == 3 and sub.unsigned == 3
