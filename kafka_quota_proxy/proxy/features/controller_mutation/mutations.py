"""A process's controller mutation quotas (KIP-599, ``quota.mutation``): the budgets, what it
knows of each topic's partitions (what deleting it or adding to it costs), and the metrics.
The request path is ``proxy.features.controller_mutation.filter``."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.decoded import metadata_topics
from kafka_quota_proxy.proxy.clock import now_ms
from kafka_quota_proxy.quota.mutation import MutationQuotas, TopicPartitions

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import QuotasConfig



class ControllerMutations:
    def __init__(self, quotas: QuotasConfig) -> None:
        w = quotas.controller_mutation_window
        self.quotas = MutationQuotas(quotas.mutation_rates(), w.samples, w.size_seconds * 1000)
        self.partitions = TopicPartitions()
        # What the broker creates for a CreateTopics topic that asks for its default (learnt
        # from the first such topic's result, CreateTopics v5+; Kafka's num.partitions: 1).
        self.default_partitions = 1
        self.topics: Counter[tuple[str, str]] = Counter()  # (api, accepted|throttled) -> topics
        self.recorded: defaultdict[str, float] = defaultdict(float)  # api -> partitions
        self.estimated = 0  # topics whose partitions were not known (counted as 1)
        self.undecodable = 0  # requests passed through unread (not counted)

    def configure(self, quotas: QuotasConfig, now_ms: int) -> None:
        w = quotas.controller_mutation_window
        self.quotas.update(quotas.mutation_rates(), w.samples, w.size_seconds * 1000, now_ms)

    def observe_metadata(self, response: Any) -> None:
        """A decoded MetadataResponse on its way to a client: the topics' partitions."""
        known = self.partitions
        for name, topic_id, partitions in metadata_topics(response):
            if partitions is None:
                known.forget(name)
            else:
                known.observe(name, topic_id, len(partitions))

    def metric_families(self) -> Iterator[Any]:
        c = CounterMetricFamily(
            "kafka_proxy_controller_mutation_topics",
            "Topics of CreateTopics, CreatePartitions and DeleteTopics requests under a "
            "controller_mutation_rate quota, by API and result (throttled: refused with "
            "THROTTLING_QUOTA_EXCEEDED, strict versions)", labels=["api", "result"])
        for (api, result), n in sorted(self.topics.items()):
            c.add_metric([api, result], n)
        yield c
        c = CounterMetricFamily(
            "kafka_proxy_controller_mutation_partitions",
            "Partitions recorded against controller_mutation_rate quotas, by API",
            labels=["api"])
        for api, partitions in sorted(self.recorded.items()):
            c.add_metric([api], partitions)
        yield c
        c = CounterMetricFamily(
            "kafka_proxy_controller_mutation_estimated_topics",
            "Topics deleted or extended whose partition count the proxy had not seen (counted "
            "as one partition)")
        c.add_metric([], self.estimated)
        yield c
        c = CounterMetricFamily(
            "kafka_proxy_controller_mutation_unread_requests",
            "CreateTopics, CreatePartitions and DeleteTopics requests forwarded as sent and not "
            "counted: a version kio does not read, a frame that does not decode, or one over "
            "1 MiB")
        c.add_metric([], self.undecodable)
        yield c
        g = GaugeMetricFamily(
            "kafka_proxy_controller_mutation_tokens",
            "Tokens left in each controller mutation budget (partitions; below 0: throttled)",
            labels=["user", "client_id"])
        now = now_ms()
        for budget in self.quotas.budgets():
            g.add_metric([budget.tags[0], budget.tags[1]], budget.bucket.measure(now))
        yield g


def api_label(api_key: int) -> str:
    return apis.api_name(api_key)
