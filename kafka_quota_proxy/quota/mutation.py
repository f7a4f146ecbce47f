"""Kafka's controller mutation quota (KIP-599): partitions created, added or deleted per
second by CreateTopics, CreatePartitions and DeleteTopics, per (user, client-id) with the
8-level precedence of the other client quotas, counted by Kafka's ``TokenBucket``.

Pure: time is passed in (ms). What Kafka does, rule by rule (``docs/quota-admin.md``):

- the bucket holds at most ``burst = rate x samples x window seconds`` tokens and refills at
  ``rate`` tokens a second; a new bucket starts full (Kafka's starts at 0 tokens with its
  last update at time 0, so its first refill fills it);
- a mutation records its partitions as tokens spent (the bucket may go negative); a
  violation is a bucket below 0 (exactly 0 is fine), and its throttle time the time to
  refill to 0: ``Math.round(-tokens / rate * 1000)`` ms;
- strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): each topic in request
  order is checked before it is recorded; a bucket below 0 rejects the topic
  (THROTTLING_QUOTA_EXCEEDED, nothing recorded) with that throttle time; a bucket at 0 or
  above accepts it whatever it costs (without throttle time);
- permissive (older versions): every topic is recorded and goes through; a bucket below 0
  afterwards gives the response a throttle time;
- the throttle time a response carries decays with the time since it was computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_quota_proxy.quota.entities import EntityKey, Tags, metric_tags, quota_limit
from kafka_quota_proxy.quota.throttle import INT32_MAX, java_round

# The first version of each API whose throttled topics are refused (KIP-599): older ones are
# only throttled. CreateTopics, DeleteTopics, CreatePartitions.
STRICT_SINCE: Mapping[int, int] = {19: 6, 20: 5, 37: 3}


def strict(api_key: int, api_version: int) -> bool:
    return api_version >= STRICT_SINCE[api_key]


def _burst(rate: float, samples: int, window_ms: int) -> float:
    """``TokenBucket.burst``: ``samples * convert(timeWindowMs, SECONDS) * quota``."""
    return samples * (window_ms / 1000.0) * rate


class TokenBucket:
    """Kafka's ``org.apache.kafka.common.metrics.stats.TokenBucket`` with its quota."""

    __slots__ = ("burst", "last_ms", "rate", "tokens")

    def __init__(self, rate: float, samples: int, window_ms: int) -> None:
        self.rate = rate
        self.burst = _burst(rate, samples, window_ms)
        # Kafka's starts at 0 tokens updated at time 0: its first refill, at any wall-clock
        # time, fills it to exactly ``burst``
        self.tokens = self.burst
        self.last_ms: int | None = None

    def reconfigure(self, rate: float, samples: int, window_ms: int, now_ms: int) -> None:
        """A new quota, as Kafka's ``updateQuotaMetricConfigs`` gives the bucket a new
        ``MetricConfig``: the tokens stay as they are, and the next refill (from the last
        update, at the new rate) holds them to the new burst. ``now_ms`` is unused: Kafka does
        not refill on a quota change."""
        del now_ms
        self.rate = rate
        self.burst = _burst(rate, samples, window_ms)

    def _refill(self, now_ms: int) -> None:
        """``refill``: ``tokens = min(burst, tokens + quota * convert(now - last, SECONDS))``.
        Time never goes back here (a monotonic clock), so a refill at or before the last update
        changes nothing but the clamp, as Kafka's refill of 0 ms does."""
        last = self.last_ms
        if last is None:  # Kafka's first refill: min(burst, 0 + quota * now in seconds)
            self.tokens = self.burst
            self.last_ms = now_ms
            return
        if now_ms < last:
            now_ms = last
        self.tokens = min(self.burst, self.tokens + self.rate * ((now_ms - last) / 1000.0))
        self.last_ms = now_ms

    def measure(self, now_ms: int) -> float:
        self._refill(now_ms)
        return self.tokens

    def record(self, permits: float, now_ms: int) -> None:
        self._refill(now_ms)
        self.tokens = min(self.burst, self.tokens - permits)

    def throttle_ms(self, now_ms: int) -> int:
        """How long until the bucket is back at 0 (0 when it is not below)."""
        tokens = self.measure(now_ms)
        # ControllerMutationQuotaManager.throttleTimeMs: Math.round(-value / bound * 1000)
        return min(java_round(-tokens / self.rate * 1000.0), INT32_MAX) if tokens < 0 else 0


@dataclass(slots=True)
class MutationThrottle:
    """What one request's mutations were throttled by (Kafka's per-request
    ``ControllerMutationQuota``): ``throttle_ms(now)`` decays from when it was set."""

    last_throttle_ms: int = 0
    recorded_at_ms: int = 0

    def set(self, throttle_ms: int, now_ms: int) -> None:
        self.last_throttle_ms = throttle_ms
        self.recorded_at_ms = now_ms

    def throttle_ms(self, now_ms: int) -> int:
        return max(0, self.last_throttle_ms - (now_ms - self.recorded_at_ms))


@dataclass(slots=True)
class MutationBudget:
    """The bucket of one (user, client-id) budget, its limit and where the limit comes
    from."""

    tags: Tags
    entity: EntityKey
    bucket: TokenBucket
    throttled: int = 0  # topics refused (strict) or requests throttled (permissive)
    recorded: float = field(default=0.0)  # partitions recorded, in all

    def check(self, throttle: MutationThrottle, now_ms: int) -> bool:
        """Strict: may the next topic go? If not, ``throttle`` is set (Kafka's
        ``ThrottlingQuotaExceededException``) and nothing is recorded."""
        wait = self.bucket.throttle_ms(now_ms)
        if wait > 0 or self.bucket.tokens < 0:
            throttle.set(wait, now_ms)
            self.throttled += 1
            return False
        return True

    def record(self, permits: float, now_ms: int) -> None:
        self.bucket.record(permits, now_ms)
        self.recorded += permits

    def record_permissive(self, permits: float, throttle: MutationThrottle, now_ms: int) -> None:
        """Permissive: record, then throttle if the bucket went below 0."""
        self.record(permits, now_ms)
        wait = self.bucket.throttle_ms(now_ms)
        if wait > 0:
            throttle.set(wait, now_ms)
            self.throttled += 1


class MutationQuotas:
    """Every controller mutation budget of a process, from the configured
    ``controller_mutation_rate`` per entity."""

    def __init__(self, rates: Mapping[EntityKey, float], samples: int = 11,
                 window_ms: int = 1000) -> None:
        self.rates: dict[EntityKey, float] = dict(rates)
        self.samples = samples
        self.window_ms = window_ms
        self._budgets: dict[Tags, MutationBudget] = {}

    @property
    def enabled(self) -> bool:
        """Any rate configured: else Kafka's ``UnboundedControllerMutationQuota`` (never
        exceeded, no throttle)."""
        return bool(self.rates)

    def update(self, rates: Mapping[EntityKey, float], samples: int, window_ms: int,
               now_ms: int) -> None:
        """New rates: budgets keep their tokens, bounded by their new burst; a budget whose
        entity no longer has a rate is dropped."""
        self.rates = dict(rates)
        self.samples, self.window_ms = samples, window_ms
        for tags, budget in list(self._budgets.items()):
            limit, entity = quota_limit(self.rates, tags)
            if limit is None or entity is None:
                del self._budgets[tags]
                continue
            budget.entity = entity
            budget.bucket.reconfigure(limit, samples, window_ms, now_ms)

    def budget(self, user: str, client_id: str) -> MutationBudget | None:
        """The budget a (user, client-id) connection's mutations count against, or None when
        no controller_mutation_rate applies to it."""
        if not self.rates:
            return None
        tags, level = metric_tags(self.rates, user, client_id)
        if level is None:
            return None
        found = self._budgets.get(tags)
        if found is None:
            limit, entity = quota_limit(self.rates, tags)
            if limit is None or entity is None:
                return None
            found = MutationBudget(tags, entity,
                                   TokenBucket(limit, self.samples, self.window_ms))
            self._budgets[tags] = found
        return found

    def expire(self, now_ms: int) -> int:
        """Drop the budgets whose bucket has refilled (a new budget starts full, so nothing
        changes for their clients): budgets stay as many as were used in the last window,
        however many client-ids come and go. Returns how many were dropped."""
        full = [tags for tags, b in self._budgets.items()
                if b.bucket.measure(now_ms) >= b.bucket.burst]
        for tags in full:
            del self._budgets[tags]
        return len(full)

    def budgets(self) -> list[MutationBudget]:
        return list(self._budgets.values())


class TopicPartitions:
    """How many partitions each topic has, as last seen (Metadata responses relayed to
    clients, the mutations' own results): what a DeleteTopics or CreatePartitions costs."""

    def __init__(self, max_topics: int = 1_000_000) -> None:
        self._by_name: dict[str, int] = {}
        self._by_id: dict[Any, str] = {}
        self._max = max_topics

    def __len__(self) -> int:
        return len(self._by_name)

    def observe(self, name: str, topic_id: Any, partitions: int) -> None:
        if name not in self._by_name and len(self._by_name) >= self._max:
            return
        self._by_name[name] = partitions
        if topic_id is not None:
            self._by_id[topic_id] = name

    def forget(self, name: str | None, topic_id: Any = None) -> None:
        if name is None and topic_id is not None:
            name = self._by_id.get(topic_id)
        if name is not None:
            self._by_name.pop(name, None)
        if topic_id is not None:
            self._by_id.pop(topic_id, None)

    def count(self, name: str | None, topic_id: Any = None) -> int | None:
        if name is None and topic_id is not None:
            name = self._by_id.get(topic_id)
        return None if name is None else self._by_name.get(name)
