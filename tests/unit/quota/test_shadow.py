"""The shadow engine (``quota.shadow.ShadowQuotas``) and a replay of what it recorded
(``quota.replay.replay_rows``, summed per budget by ``replayed_budgets``) give the same
would-be throttles, for any sequence of requests: every quota type, several brokers, budgets
shared by a user, the storage scale each Produce was read under (the live storage settings,
followed). (A budget that expires takes its counters with it, in the shadow's metrics as in
the live ones: the per-budget sums compare within an expiry.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.quota.manager import StorageScaling
from kafka_quota_proxy.quota.replay import Row, StorageSettings, settings_from_section
from kafka_quota_proxy.quota.request_time import RequestTimeModel
from kafka_quota_proxy.quota.shadow import ShadowQuotas, per_type, replayed_budgets

CANDIDATE = settings_from_section({"window": {"samples": 3, "size_seconds": 1}, "entities": [
    {"client-id": "<default>", "producer_byte_rate": 30_000},
    {"user": "alice", "consumer_byte_rate": 50_000},
    {"user": "<default>", "request_percentage": 1}]})
# The live request-time models: the default, and one that charges the proxy's time only
# (a request the proxy spent no measured time on then costs MIN_CHARGE_MS, never 0).
MODELS = (RequestTimeModel(), RequestTimeModel(base_us=0.0, per_kib_us=0.0))
STORAGE = StorageSettings(unquoted_produce_bound=20_000, exempt_users=frozenset({"ops"}))

request = st.tuples(
    st.integers(0, 400),  # ms after the previous request
    st.sampled_from([1, 2]),  # broker
    st.sampled_from([("alice", "a1"), ("alice", "a2"), ("bob", "b1"), ("ops", "o1")]),
    st.sampled_from([0, 0, 1, 3]),  # api key
    st.integers(10, 40_000),  # request bytes
    st.integers(-1, 200_000),  # response bytes (-1: none)
    # the proxy's own time on it (ms), 0 included: the request time charged is the live
    # model's (a model that charges nothing for the broker included)
    st.sampled_from([0.0, 0.0, 0.01, 0.5, 20.0]),
    st.sampled_from([None, None, 1.0, 0.5, 0.0]),  # storage scale of a Produce
)


@settings(max_examples=60, deadline=None)
@given(st.lists(request, min_size=1, max_size=300), st.sampled_from(MODELS))
def test_a_replay_of_what_the_shadow_recorded_gives_its_throttles(
        requests: list[tuple], model: RequestTimeModel) -> None:
    storage = StorageScaling()
    storage.unquoted_produce_bound = STORAGE.unquoted_produce_bound
    storage.exempt_users = STORAGE.exempt_users
    shadow = ShadowQuotas(CANDIDATE, storage=storage)
    rows: dict[int, list[Row]] = {}
    now = 10_000_000
    for gap, broker, (user, client_id), api_key, req, resp, proxy_ms, scale in requests:
        now += gap
        if api_key != 0:
            scale = None
        if api_key != 0 and resp < 0:
            resp = 100
        request_time = model.charge_ms(req, resp, proxy_ms) if resp >= 0 else 0.0
        shadow.record(broker, user, client_id, api_key, req, resp, request_time, now, scale)
        rows.setdefault(broker, []).append(
            (now, user, client_id, api_key, req, resp, 0, request_time, False, 0, scale))
    replayed = replayed_budgets(rows, CANDIDATE, STORAGE)
    assert replayed == shadow.budgets()
    assert per_type(replayed) == {qt: (n, shadow.throttle_ms[qt])
                                  for qt, n in shadow.throttled.items() if n}


def test_throttles_are_counted_never_anything_else() -> None:
    shadow = ShadowQuotas(CANDIDATE)
    throttles = [shadow.record(1, "bob", "b1", 0, 40_004, 60, 0.5, 1_000 + i, None)
                 for i in range(20)]
    assert any(p for p, _, _ in throttles)
    (budget,) = [k for k in shadow.budgets() if k[1].short == "produce"]
    assert budget == (1, budget[1], ("", "b1"))
    n, ms = shadow.budgets()[budget]
    assert n == sum(1 for p, _, _ in throttles if p) and ms == sum(p for p, _, _ in throttles)
    # another candidate: the budgets keep what they measured
    shadow.update(settings_from_section({"window": {"samples": 3, "size_seconds": 1},
                                         "entities": [{"client-id": "<default>",
                                                       "producer_byte_rate": 10**9}]}))
    assert shadow.budgets()[budget] == (n, ms)
    assert shadow.record(1, "bob", "b1", 0, 40_004, 60, 0.5, 1_100, None) == (0, 0, 0)
    assert not shadow.request_on and not shadow.fetch_on and shadow.produce_on


def test_requests_the_live_model_charges_nothing_replay_as_they_were_charged() -> None:
    # A live model charging the proxy's time only, and requests the proxy spent no measured
    # time on: 2,000 a second under a request quota of 1 %. Charged 0 ms, a capture row would
    # read as "not recorded" and the replay (under the candidate's default model) would
    # charge 50 us each, 10 % of a thread: throttles the shadow never had.
    free = RequestTimeModel(base_us=0.0, per_kib_us=0.0)
    shadow = ShadowQuotas(CANDIDATE)
    rows: dict[int, list[Row]] = {1: []}
    for i in range(4_000):
        now = 10_000_000 + i // 2
        charge = free.charge_ms(60, 40, 0.0)
        shadow.record(1, "bob", "b1", 3, 60, 40, charge, now, None)
        rows[1].append((now, "bob", "b1", 3, 60, 40, 0, charge, False, 0, None))
    assert shadow.budgets() == {}
    assert replayed_budgets(rows, CANDIDATE, STORAGE) == {}
