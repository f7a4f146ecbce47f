"""Storage throttling in the quota engine: produce bounds scaled by the factor, a base rate for
producers without a quota, exempt users, no throttle from the engine while paused, and the
request stream holding a produce request unread."""

from __future__ import annotations

from protocol.correlation import CorrelationTable
from protocol.stream import RequestStream
from proxy.quotas import QuotaEnforcer
from quota.entities import DEFAULT, EntityKey, QuotaType
from quota.manager import QuotaManager, QuotaSettings

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


def test_a_scaled_quota_throttles_sooner_and_at_most_one_window() -> None:
    full, half = QuotaManager(SETTINGS), QuotaManager(SETTINGS)
    half.produce_scale = 0.5
    t_full, t_half = throttles(full, "u", "quoted"), throttles(half, "u", "quoted")
    first = lambda ts: next(i for i, t in enumerate(ts) if t > 0)  # noqa: E731
    assert first(t_half) < first(t_full)
    assert max(t_half) <= 1000  # capped at one window while scaled
    # A producer with no quota is not limited, unless storage scaling is on.
    free, based = QuotaManager(SETTINGS), QuotaManager(SETTINGS)
    based.produce_scale, based.unquoted_produce_bound = 1.0, 10_000.0
    assert not any(throttles(free, "u", "other"))
    assert any(throttles(based, "u", "other"))
    based.exempt_users = frozenset({"agent"})
    assert not any(throttles(based, "agent", "other2"))


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
    stream = RequestStream(CorrelationTable())
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
