"""Storage throttling in the quota engine: produce bounds scaled by the factor, a base rate for
producers without a quota, exempt users, no throttle from the engine while paused, and the
request stream holding a produce request unread."""

from __future__ import annotations

import itertools

import pytest

from kafka_quota_proxy.protocol.correlation import CorrelationTable
from kafka_quota_proxy.quota.enforcer import QuotaEnforcer
from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, QuotaType
from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings
from testkit.request_reader import reading_stream

P = QuotaType.PRODUCE
SETTINGS = QuotaSettings(samples=3, window_ms=1000,
                         entities={EntityKey(None, "quoted"): {P: 10_000.0}})


def throttles(m: QuotaManager, user: str, client: str, n: int = 30, size: int = 1000) -> list[int]:
    return [m.record(P, user, client, size, 10 * i) for i in range(n)]


def test_produce_bounds_scale_with_the_factor() -> None:
    m = QuotaManager(SETTINGS)
    m.unquoted_produce_bound = 10_000.0
    assert m.produce_bound(10_000.0, "u", "c") == 10_000.0  # inactive: as configured
    m.produce_scale = 0.5
    assert m.produce_bound(10_000.0, "u", "c") == 5_000.0
    assert m.produce_bound(None, "u", "c") == 5_000.0  # no quota: the base rate, scaled
    m.exempt_users = frozenset({"agent"})
    m.exempt_client_ids = frozenset({"volume-agent"})
    assert m.produce_bound(None, "agent", "c") is None and m.produce_bound(8.0, "agent", "c") == 8.0
    assert m.produce_bound(8.0, "u", "volume-agent") == 8.0
    assert m.produce_bound(8.0, "u", "other") == 4.0


def test_a_scaled_quota_throttles_sooner_and_pays_for_every_byte() -> None:
    full, half = QuotaManager(SETTINGS), QuotaManager(SETTINGS)
    half.produce_scale = 0.5
    t_full, t_half = throttles(full, "u", "quoted"), throttles(half, "u", "quoted")
    first = lambda ts: next(i for i, t in enumerate(ts) if t > 0)  # noqa: E731
    assert first(t_half) < first(t_full)
    # Paced at 5,000 B/s with one window (1 s) of bytes free: 30 x 1,000 B sent over 290 ms
    # are paid for 6 s from the first, so the last is held back 6 - 0.29 - 1 s; no cap at
    # one window lets the next batch through early.
    assert t_half[-1] == 6000 - 290 - 1000
    assert [t for t in t_half if t] == list(range(t_half[first(t_half)], t_half[-1] + 1, 190))
    # A producer with no quota is not limited, unless storage scaling is on.
    free, based = QuotaManager(SETTINGS), QuotaManager(SETTINGS)
    based.produce_scale, based.unquoted_produce_bound = 1.0, 10_000.0
    assert not any(throttles(free, "u", "other"))
    assert any(throttles(based, "u", "other"))
    based.exempt_users = frozenset({"agent"})
    assert not any(throttles(based, "agent", "other2"))


def _greedy(batch: int, samples: int = 3, factor: float = 0.5, base: float = 400_000.0,
            wire: float = 4_000_000.0) -> tuple[list[tuple[float, int]], float]:
    """A producer with no quota sends ``batch``-byte requests back to back (at ``wire`` B/s)
    for 4 s, then storage scaling begins and it waits out each throttle: (time, bytes) of
    each request, and when scaling began (ms)."""
    m = QuotaManager(QuotaSettings(samples=samples, window_ms=1000))
    m.unquoted_produce_bound = base
    t, begins, sent = 0.0, 4000.0, []
    while t < begins + 40_000:
        if t >= begins:
            m.produce_scale = factor
        throttle = m.record(P, "u", "producer", batch, int(t))
        sent.append((t, batch))
        t += max(throttle, batch * 1000 / wire)
    return sent, begins


@pytest.mark.parametrize("batch", [16_384, 65_536, 262_144, 1_000_000])
@pytest.mark.parametrize("samples", [3, 11])
def test_scaled_rate_holds_whatever_the_batch_size(batch: int, samples: int) -> None:
    """Over 14 s the producer gets the scaled rate (+-10%), from 16 KB to 1 MB requests (which
    Kafka's sampled rate over 3 x 1 s windows lets through at 1.7x, and a throttle capped at
    one window at several times the rate); it is never frozen longer than one window beyond
    what its own request costs at the scaled rate."""
    sent, begins = _greedy(batch, samples)
    target = 0.5 * 400_000

    def rate(start: float) -> float:  # from one request to the first 14 s or more later
        times = [t for t, _ in sent if t >= start]
        end = next(t for t in times if t >= times[0] + 14_000)
        return sum(n for t, n in sent if times[0] <= t < end) / ((end - times[0]) / 1000)

    assert rate(begins + 3000) == pytest.approx(target, rel=0.10)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(sent) if a >= begins]
    cost = batch * 1000 / target  # what one request costs at the scaled rate (ms)
    wire = batch * 1000 / 4_000_000
    assert gaps[0] <= max(cost - 1000, wire) + 1  # when scaling begins: not frozen at all
    assert max(gaps) <= max(cost, wire) + 1  # then: each request, its own cost
    before = [t for t, _ in sent if t < begins]
    assert begins - before[-1] < 1000 and sum(n for t, n in sent if t < begins) > 4 * target


def test_pacing_is_kept_across_factor_changes_and_owed_only_for_scaled_requests() -> None:
    m = QuotaManager(SETTINGS)
    m.unquoted_produce_bound = 10_000.0
    m.produce_scale = 0.5
    assert m.record(P, "u", "c", 10_000, 0) == 1000  # 2 s paid for: 1 s beyond the free window
    m.produce_scale = 0.25  # a new factor keeps what is owed, at the new rate from now on
    assert m.record(P, "u", "c", 2_500, 0) == 2000
    m.produce_scale = None  # OPEN: no pacing (no quota: unlimited)
    assert m.record(P, "u", "c", 100_000, 10) == 0
    m.produce_scale = 0.5  # THROTTLE again: what was owed (until 3 s) still is; the bytes
    assert m.record(P, "u", "c", 5_000, 20) == 3000 + 1000 - 20 - 1000  # sent while open not
    m.produce_scale = 0.5
    later = 60_000
    # Requests read before scaling began are not paced, although recorded after it began:
    # an unthrottled producer's pipelined requests freeze nothing.
    assert m.record(P, "u", "fresh", 1_000_000, later, scale=None) == 0
    assert m.record(P, "u", "fresh", 1_000_000, later, scale=None) == 0
    assert m.record(P, "u", "fresh", 5_000, later) == 0  # one window free
    assert m.record(P, "u", "fresh", 5_000, later) == 1000


def test_paused_the_engine_throttles_nothing_and_has_no_headroom() -> None:
    m = QuotaManager(SETTINGS)
    m.produce_scale, m.unquoted_produce_bound = 0.0, 10_000.0
    assert not any(throttles(m, "u", "quoted"))  # the proxy holds requests instead
    assert not m.produce_headroom("u", "quoted", 400)
    m.exempt_users = frozenset({"u"})
    assert m.produce_headroom("u", "fresh", 400)


def test_enforcer_limits_every_producer_while_storage_applies() -> None:
    q = QuotaEnforcer(QuotaSettings(entities={EntityKey(DEFAULT, None): {
        QuotaType.FETCH: 1.0}}))
    q.configure_storage(1e6, frozenset({"agent"}), frozenset({"volume-agent"}))
    assert not q.enabled(P) and P not in q.limits("u", "c")
    epoch = q.storage_epoch
    q.set_storage(0.5)
    assert q.enabled(P) and P in q.limits("u", "c") and P not in q.limits("agent", "c")
    assert P not in q.limits("u", "volume-agent")
    assert q.manager(3).produce_scale == 0.5  # new managers too
    assert q.storage_epoch == epoch + 1
    q.set_storage(None)
    assert not q.enabled(P) and q.manager(3).produce_scale is None


def _frame(api_key: int, body: bytes = b"") -> bytes:
    header = api_key.to_bytes(2, "big") + (0).to_bytes(2, "big") + (1).to_bytes(4, "big") + (
        (-1).to_bytes(2, "big", signed=True))
    payload = header + body
    return len(payload).to_bytes(4, "big") + payload


def test_request_stream_peeks_and_holds_the_next_frame() -> None:
    stream = reading_stream(CorrelationTable())
    metadata = _frame(3)
    assert stream.next_api_key(metadata[:5]) is None  # not enough to tell
    assert stream.next_api_key(metadata) == 3
    forwarded, events = stream.feed(metadata[:5])
    assert stream.next_api_key(metadata[5:]) == 3  # the pending start counts
    stream.hold(metadata[5:])
    assert stream.held
    forwarded, events = stream.feed(b"")
    assert bytes(forwarded) == metadata and [e.api_key for e in events] == [3]
    assert stream.next_api_key(b"") is None
