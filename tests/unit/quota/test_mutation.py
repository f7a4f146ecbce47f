"""Kafka's controller mutation quota (KIP-599) in ``quota.mutation``: one test per rule of
Kafka's TokenBucket and ControllerMutationQuotaManager (rules Q1-Q13 of the reference note,
``docs/quota-admin.md``). The request-path rules (Q4, Q6-Q7, Q9-Q11, Q13) are also tested on
frames in ``tests/unit/proxy/test_controller_mutation.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey
from kafka_quota_proxy.quota.mutation import (
    MutationQuotas,
    MutationThrottle,
    TokenBucket,
    TopicPartitions,
    strict,
)

T0 = 1_700_000_000_000  # wall-clock ms, as the proxy passes


def test_q1_burst_is_rate_times_samples_times_window_and_a_new_bucket_is_full() -> None:
    bucket = TokenBucket(2.0, 11, 1000)
    assert bucket.burst == 22.0
    assert bucket.measure(T0) == 22.0
    assert TokenBucket(2.0, 5, 3000).burst == 30.0


def test_q2_refills_at_the_rate_capped_at_the_burst() -> None:
    bucket = TokenBucket(2.0, 11, 1000)
    bucket.record(30.0, T0)
    assert bucket.measure(T0) == -8.0
    assert bucket.measure(T0 + 1500) == pytest.approx(-5.0)
    assert bucket.measure(T0 + 60_000) == 22.0  # never above the burst
    bucket.record(-100.0, T0 + 60_000)  # a refund too
    assert bucket.measure(T0 + 60_000) == 22.0


def test_q3_violation_only_below_zero_and_throttle_is_the_time_back_to_zero() -> None:
    bucket = TokenBucket(4.0, 11, 1000)
    bucket.record(44.0, T0)
    assert bucket.measure(T0) == 0.0
    assert bucket.throttle_ms(T0) == 0  # exactly 0 is fine
    bucket.record(3.0, T0)
    assert bucket.throttle_ms(T0) == 750  # round(3 / 4 * 1000)
    assert bucket.throttle_ms(T0 + 500) == 250


def test_q4_strict_versions() -> None:
    assert [strict(19, v) for v in (5, 6, 7)] == [False, True, True]
    assert [strict(20, v) for v in (4, 5, 6)] == [False, True, True]
    assert [strict(37, v) for v in (2, 3)] == [False, True]


def _budget(rate: float = 1.0):  # type: ignore[no-untyped-def]
    quotas = MutationQuotas({EntityKey("alice", None): rate})
    budget = quotas.budget("alice", "app")
    assert budget is not None
    return budget


def test_q5_strict_with_tokens_left_takes_a_topic_whatever_it_costs_without_throttle() -> None:
    budget = _budget(1.0)  # burst 11
    throttle = MutationThrottle()
    assert budget.check(throttle, T0)
    budget.record(50.0, T0)  # far below 0
    assert budget.bucket.measure(T0) == -39.0
    assert throttle.throttle_ms(T0) == 0


def test_q6_strict_below_zero_refuses_records_nothing_and_throttles() -> None:
    budget = _budget(2.0)  # burst 22
    budget.record(25.0, T0)
    throttle = MutationThrottle()
    assert not budget.check(throttle, T0)
    assert budget.bucket.measure(T0) == -3.0  # nothing recorded for the refused topic
    assert throttle.throttle_ms(T0) == 1500
    assert budget.throttled == 1


def test_q7_strict_one_request_first_topic_overdraws_second_is_refused() -> None:
    budget = _budget(1.0)
    budget.record(6.0, T0)  # 5 tokens left
    throttle = MutationThrottle()
    outcome = []
    for cost in (10.0, 1.0):
        ok = budget.check(throttle, T0)
        outcome.append(ok)
        if ok:
            budget.record(cost, T0)
    assert outcome == [True, False]
    assert throttle.throttle_ms(T0) == 5000


def test_q8_permissive_records_everything_and_throttles_when_below_zero() -> None:
    budget = _budget(2.0)  # burst 22
    throttle = MutationThrottle()
    budget.record_permissive(20.0, throttle, T0)
    assert throttle.throttle_ms(T0) == 0
    budget.record_permissive(6.0, throttle, T0)
    assert budget.bucket.measure(T0) == -4.0
    assert throttle.throttle_ms(T0) == 2000


def test_q12_no_rate_configured_means_no_budget() -> None:
    quotas = MutationQuotas({})
    assert not quotas.enabled
    assert quotas.budget("alice", "app") is None
    only_bob = MutationQuotas({EntityKey("bob", None): 1.0})
    assert only_bob.budget("alice", "app") is None


def test_q13_throttle_decays_with_the_time_since_it_was_set() -> None:
    throttle = MutationThrottle()
    throttle.set(1200, T0)
    assert throttle.throttle_ms(T0 + 200) == 1000
    assert throttle.throttle_ms(T0 + 5000) == 0


def test_precedence_is_kafkas_eight_levels() -> None:
    quotas = MutationQuotas({
        EntityKey("alice", "app"): 9.0, EntityKey("alice", None): 5.0,
        EntityKey(DEFAULT, None): 2.0})
    got = {(u, c): b.bucket.rate for u, c in [("alice", "app"), ("alice", "x"), ("bob", "x")]
           if (b := quotas.budget(u, c)) is not None}
    assert got == {("alice", "app"): 9.0, ("alice", "x"): 5.0, ("bob", "x"): 2.0}
    # one budget per user for a user-level entity, shared by its client-ids
    assert quotas.budget("alice", "x") is quotas.budget("alice", "y")
    assert quotas.budget("bob", "x") is not quotas.budget("carol", "x")
    clients = MutationQuotas({EntityKey(None, DEFAULT): 1.0, EntityKey(None, "ops"): 3.0})
    ops, other = clients.budget("ANONYMOUS", "ops"), clients.budget("ANONYMOUS", "x")
    assert ops is not None and other is not None
    assert (ops.bucket.rate, other.bucket.rate) == (3.0, 1.0)
    assert clients.budget("ANONYMOUS", "y") is not other  # clients/<default>: per client-id


def test_update_keeps_tokens_bounded_by_the_new_burst_and_drops_unlimited_budgets() -> None:
    quotas = MutationQuotas({EntityKey("alice", None): 10.0, EntityKey("bob", None): 1.0})
    alice = quotas.budget("alice", "a")
    assert alice is not None and quotas.budget("bob", "b") is not None
    alice.record(10.0, T0)  # 100 of 110 left
    quotas.update({EntityKey("alice", None): 1.0}, 11, 1000, T0)
    assert quotas.budget("alice", "a") is alice
    assert alice.bucket.measure(T0) == 11.0  # clamped to the new burst
    assert quotas.budget("bob", "b") is None
    assert len(quotas.budgets()) == 1


def test_topic_partitions_by_name_and_id() -> None:
    known = TopicPartitions()
    known.observe("t", "id-1", 6)
    assert known.count("t") == 6 and known.count(None, "id-1") == 6
    known.forget(None, "id-1")
    assert known.count("t") is None


@given(st.lists(st.tuples(st.integers(0, 5000), st.floats(-20, 20)), max_size=30),
       st.floats(0.1, 50))
def test_tokens_match_kafkas_formula(steps: list[tuple[int, float]], rate: float) -> None:
    """Against a direct transcription of TokenBucket.record/refill."""
    bucket = TokenBucket(rate, 11, 1000)
    burst = rate * 11
    tokens, last, now = 0.0, 0, T0  # Kafka's constructor state
    for gap, permits in steps:
        now += gap
        tokens = min(burst, tokens + rate * (now - last) / 1000.0)
        last = now
        tokens = min(burst, tokens - permits)
        bucket.record(permits, now)
        assert bucket.tokens == pytest.approx(tokens, abs=1e-6)


def test_budgets_back_at_a_full_bucket_are_dropped_as_a_new_one_would_start_full() -> None:
    quotas = MutationQuotas({EntityKey(None, DEFAULT): 1.0}, samples=11, window_ms=1000)
    for i in range(50):  # 50 client-ids, one partition each
        budget = quotas.budget("ANONYMOUS", f"c{i}")
        assert budget is not None
        budget.record(1.0, T0 + i)
    assert quotas.expire(T0 + 1000 + 10) == 11  # c0..c10 refilled a token since
    assert len(quotas.budgets()) == 39
    assert quotas.expire(T0 + 60_000) == 39 and quotas.budgets() == []
