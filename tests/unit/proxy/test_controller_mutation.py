"""The controller mutation quota on frames (``proxy.features.controller_mutation.filter``): what
goes upstream, what the client gets back and what each topic costs, for CreateTopics,
DeleteTopics and CreatePartitions in strict and permissive versions (KIP-599 rules Q4-Q13; the
bucket's own rules are ``tests/unit/quota/test_mutation.py``'s)."""

from __future__ import annotations

import dataclasses
import datetime
import io
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.headers import (
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
)
from kafka_quota_proxy.protocol.mutation_frames import decode_request
from kafka_quota_proxy.proxy.features.controller_mutation.filter import (
    CONTROLLER_MUTATION,
    ControllerMutationFilter,
)
from kafka_quota_proxy.proxy.features.controller_mutation.mutations import ControllerMutations
from testkit.filter_host import FakeFilterHost
from testkit.frames import create_topics_request

NOW = [1_700_000_000_000]


@pytest.fixture(autouse=True)
def _frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter's clock stands still unless a test moves it (exact Kafka numbers)."""
    monkeypatch.setattr("kafka_quota_proxy.proxy.features.controller_mutation.filter.now_ms",
                        lambda: NOW[0])


def _mutations(rate: float = 1.0, samples: int = 11) -> ControllerMutations:
    return ControllerMutations(QuotasConfig.model_validate({
        "controller_mutation_window": {"samples": samples, "size_seconds": 1},
        "entities": [{"user": "alice", "controller_mutation_rate": rate}]}))


def _encode(api_key: int, version: int, value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return encode_request_header(api_key, version, 7, "admin") + buf.getvalue()


def delete_topics(names: list[str], version: int = 6) -> bytes:
    cls = load_request_schema(20, version)
    if version >= 6:
        mod = __import__(cls.__module__, fromlist=["_"])
        return _encode(20, version, cls(topics=tuple(
            mod.DeleteTopicState(name=n, topic_id=None) for n in names),
            timeout=datetime.timedelta(seconds=5)))
    return _encode(20, version, cls(topic_names=tuple(names),
                                    timeout=datetime.timedelta(seconds=5)))


def create_partitions(topics: list[tuple[str, int]], version: int = 3) -> bytes:
    cls = load_request_schema(37, version)
    mod = __import__(cls.__module__, fromlist=["_"])
    return _encode(37, version, cls(topics=tuple(
        mod.CreatePartitionsTopic(name=n, count=c, assignments=None) for n, c in topics),
        timeout=datetime.timedelta(seconds=5), validate_only=False))


def _entry(frame: bytes) -> InFlight:
    h = parse_request_header(frame, 0, len(frame))
    return InFlight(h.api_key, h.api_version, h.correlation_id, h.client_id, len(frame) + 4,
                    True)


def _names(api_key: int, version: int, frame: bytes) -> list[str | None]:
    return [t.name for t in decode_request(frame, api_key, version).topics]


def _response(api_key: int, version: int, results: list[tuple[str, int, int]]) -> bytes:
    """The broker's response: (name, error code, partitions created)."""
    cls = load_response_schema(api_key, version)
    mod = __import__(cls.__module__, fromlist=["_"])
    from kio.schema.errors import ErrorCode

    if api_key == 19:
        items = tuple(mod.CreatableTopicResult(
            name=n, topic_id=uuid.uuid4() if not e else None, error_code=ErrorCode(e),
            error_message=None, topic_config_error_code=0, num_partitions=p,
            replication_factor=1, configs=()) for n, e, p in results)
        value = cls(throttle_time=datetime.timedelta(0), topics=items)
    elif api_key == 20:
        names = {f.name for f in dataclasses.fields(mod.DeletableTopicResult)}
        value = cls(throttle_time=datetime.timedelta(0), responses=tuple(
            mod.DeletableTopicResult(**{k: v for k, v in {
                "name": n, "topic_id": None, "error_code": ErrorCode(e),
                "error_message": None}.items() if k in names}) for n, e, _ in results))
    else:
        value = cls(throttle_time=datetime.timedelta(0), results=tuple(
            mod.CreatePartitionsTopicResult(name=n, error_code=ErrorCode(e), error_message=None)
            for n, e, _ in results))
    buf = io.BytesIO()
    entity_writer(cls)(buf, value)
    return encode_response_header(7, apis.response_header_version(api_key, version)) + \
        buf.getvalue()


def _decode_answer(entry: InFlight, frame: bytes) -> Any:
    h = parse_response_header(frame, 0, len(frame),
                              apis.response_header_version(entry.api_key, entry.api_version))
    return entity_reader(load_response_schema(entry.api_key, entry.api_version))(
        memoryview(frame)[h.size:], 0)[0]


def _results(value: Any) -> list[tuple[str | None, int]]:
    items = getattr(value, "topics", None) or getattr(value, "responses", None) or \
        getattr(value, "results", ())
    return [(r.name, int(r.error_code)) for r in items]


def test_no_quota_configured_forwards_everything_untouched() -> None:
    f = ControllerMutationFilter(FakeFilterHost("alice"), ControllerMutations(QuotasConfig()))
    frame = create_topics_request([("a", 100), ("b", 100)])
    entry = _entry(frame)
    assert f.request_frame(entry, frame, True) is None
    assert entry.throttle_ms == 0 and entry.answer is None


def test_another_principal_is_not_counted() -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("bob"), m)
    frame = create_topics_request([("a", 100)])
    assert f.request_frame(_entry(frame), frame, True) is None
    assert m.quotas.budgets() == []


def test_q7_strict_request_goes_up_without_the_refused_topics_and_gets_their_89() -> None:
    m = _mutations(1.0)  # burst 11
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_topics_request([("a", 6), ("b", 10), ("c", 1), ("d", 1)])
    entry = _entry(frame)
    upstream = f.request_frame(entry, frame, True)
    assert upstream is not None
    # a (11 -> 5) and b (5 -> -5) go; c and d meet a bucket below zero
    assert _names(19, 7, upstream) == ["a", "b"]
    assert parse_request_header(upstream, 0, len(upstream)).correlation_id == 7
    assert entry.throttle_ms == 5000 and entry.throttled_by is CONTROLLER_MUTATION
    f.response_frame(entry, _response(19, 7, [("a", 0, 6), ("b", 0, 10)]))
    assert entry.answer is not None
    assert _results(_decode_answer(entry, entry.answer)) == [
        ("a", 0), ("b", 0), ("c", 89), ("d", 89)]
    refused = _decode_answer(entry, entry.answer).topics[2]
    assert refused.error_message is None  # Kafka's: null
    assert m.topics == {("create_topics", "accepted"): 2, ("create_topics", "throttled"): 2}


def test_q6_all_refused_is_answered_by_the_proxy_and_never_forwarded() -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    first = create_topics_request([("a", 20)])
    f.request_frame(_entry(first), first, True)  # 11 -> -9
    frame = create_topics_request([("b", 1), ("c", 1)])
    entry = _entry(frame)
    assert f.request_frame(entry, frame, True) is None  # the connection takes it out
    assert entry.answer is not None
    assert _results(_decode_answer(entry, entry.answer)) == [("b", 89), ("c", 89)]
    assert entry.throttle_ms == 9000
    assert not f._pending  # nothing waits for a broker's response


def test_q5_strict_overdraw_without_refusal_has_no_throttle() -> None:
    f = ControllerMutationFilter(FakeFilterHost("alice"), _mutations(1.0))
    frame = create_topics_request([("a", 50)])
    entry = _entry(frame)
    assert f.request_frame(entry, frame, True) is None
    assert entry.throttle_ms == 0


@pytest.mark.parametrize("version", [2, 5])
def test_q8_permissive_versions_go_whole_and_are_throttled(version: int) -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_topics_request([("a", 10), ("b", 5)], version=version)
    entry = _entry(frame)
    assert f.request_frame(entry, frame, True) is None  # forwarded as sent
    assert entry.throttle_ms == 4000  # 11 - 15 = -4 at 1/s
    assert m.topics == {("create_topics", "accepted"): 2}


def test_q9_q10_topics_the_broker_refuses_are_given_back_and_create_costs_what_it_made() -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_topics_request([("a", 4), ("exists", 3), ("c", -1)])
    entry = _entry(frame)
    f.request_frame(entry, frame, True)
    budget = m.quotas.budgets()[0]
    assert budget.bucket.tokens == pytest.approx(11 - 4 - 3 - 1)  # default: 1 until learnt
    f.response_frame(entry, _response(19, 7, [("a", 0, 4), ("exists", 36, -1), ("c", 0, 3)]))
    assert budget.bucket.tokens == pytest.approx(11 - 4 - 3, abs=0.01)  # c made 3, exists 0
    assert m.default_partitions == 3
    assert m.partitions.count("a") == 4 and m.partitions.count("exists") is None


def test_q9_delete_costs_the_partitions_last_seen_and_forgets_the_topic() -> None:
    m = _mutations(1.0)
    m.partitions.observe("big", None, 8)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = delete_topics(["big", "unknown"])
    entry = _entry(frame)
    assert f.request_frame(entry, frame, True) is None
    assert m.quotas.budgets()[0].bucket.tokens == pytest.approx(11 - 8 - 1)
    assert m.estimated == 1
    f.response_frame(entry, _response(20, 6, [("big", 0, 0), ("unknown", 3, 0)]))
    assert m.partitions.count("big") is None
    assert m.quotas.budgets()[0].bucket.tokens == pytest.approx(11 - 8, abs=0.01)


@pytest.mark.parametrize("version,strict_", [(4, False), (5, True), (6, True)])
def test_q4_delete_topics_strict_since_v5(version: int, strict_: bool) -> None:
    m = _mutations(1.0)
    m.partitions.observe("a", None, 20)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = delete_topics(["a", "b"], version=version)
    entry = _entry(frame)
    upstream = f.request_frame(entry, frame, True)
    if strict_:
        assert upstream is not None and _names(20, version, upstream) == ["a"]
        f.response_frame(entry, _response(20, version, [("a", 0, 0)]))
        assert entry.answer is not None
        assert _results(_decode_answer(entry, entry.answer)) == [("a", 0), ("b", 89)]
    else:
        assert upstream is None and entry.throttle_ms == 10000  # 11 - 21 at 1/s


def test_q9_create_partitions_costs_what_it_adds_strict_since_v3() -> None:
    m = _mutations(1.0)
    m.partitions.observe("a", None, 4)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_partitions([("a", 16), ("b", 2)])
    entry = _entry(frame)
    upstream = f.request_frame(entry, frame, True)
    assert upstream is not None and _names(37, 3, upstream) == ["a"]  # a: 11 - 12 = -1
    assert m.quotas.budgets()[0].bucket.tokens == -1.0  # the 12 partitions it adds
    f.response_frame(entry, _response(37, 3, [("a", 0, 0)]))
    assert m.partitions.count("a") == 16
    permissive = create_partitions([("a", 20)], version=2)
    e2 = _entry(permissive)
    assert f.request_frame(e2, permissive, True) is None and e2.throttle_ms > 0


def test_q11_validate_only_is_charged_as_kraft_does() -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_topics_request([("a", 11)], validate_only=True)
    f.request_frame(_entry(frame), frame, True)
    frame = create_topics_request([("b", 1)], validate_only=True)
    entry = _entry(frame)
    f.request_frame(entry, frame, True)
    assert entry.answer is None  # exactly 0 left: b goes
    frame = create_topics_request([("c", 1)], validate_only=True)
    entry = _entry(frame)
    f.request_frame(entry, frame, True)
    assert entry.answer is not None


def test_an_undecodable_request_passes_untouched() -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_topics_request([("a", 1)])[:-3]
    entry = _entry(frame)
    assert f.request_frame(entry, frame, True) is None
    assert m.undecodable == 1 and entry.answer is None


def test_a_request_too_large_to_read_whole_passes_uncounted() -> None:
    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    frame = create_topics_request([("a", 100)])
    entry = _entry(frame)
    assert f.request_frame(entry, frame, False) is None  # (cut-through: not patchable)
    assert m.undecodable == 1 and m.quotas.budgets() == [] and entry.throttle_ms == 0


def test_metadata_responses_teach_partition_counts() -> None:
    m = _mutations(1.0)
    cls = load_response_schema(3, 12)
    mod = __import__(cls.__module__, fromlist=["_"])
    from kio.schema.errors import ErrorCode

    def topic(name: str, error: int, parts: int) -> Any:
        return mod.MetadataResponseTopic(
            error_code=ErrorCode(error), name=name, topic_id=uuid.uuid4(), is_internal=False,
            partitions=tuple(mod.MetadataResponsePartition(
                error_code=ErrorCode(0), partition_index=i, leader_id=1, leader_epoch=0,
                replica_nodes=(1,), isr_nodes=(1,), offline_replicas=())
                for i in range(parts)), topic_authorized_operations=0)

    m.partitions.observe("gone", None, 2)
    m.observe_metadata(cls(throttle_time=datetime.timedelta(0), brokers=(), cluster_id=None,
                           controller_id=1, topics=(topic("t", 0, 12), topic("gone", 3, 0))))
    assert m.partitions.count("t") == 12 and m.partitions.count("gone") is None


def test_a_request_forwarded_without_topics_gets_its_own_size_among_pipelined_frames() -> None:
    """A shorter frame replaces the client's (``read_events``): its size prefix is its own
    and the frames around it go through byte for byte."""
    from kafka_quota_proxy.protocol.correlation import CorrelationTable
    from kafka_quota_proxy.protocol.request_stream import RequestStream
    from kafka_quota_proxy.proxy.connection import read_events
    from testkit.frames import request_frame

    m = _mutations(1.0)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    create = create_topics_request([("a", 12), ("b", 1), ("c", 1)])
    before = request_frame(3, 12, 5, "admin", b"\x01\x00\x00")
    after = request_frame(18, 3, 9, "admin", b"\x01\x01\x00")
    data = before + len(create).to_bytes(4, "big") + create + after
    stream = RequestStream(CorrelationTable(), copy_frame=lambda e: e.api_key == 19,
                           whole=lambda key, version: key == 19)
    forward, events = stream.feed(data)
    outcome = read_events(forward, events, f.request_frame, None, lambda e: False, stream.table)
    assert outcome.forward is not None
    out = bytes(outcome.forward)
    assert out.startswith(before) and out.endswith(after)
    middle = out[len(before):len(out) - len(after)]
    size = int.from_bytes(middle[:4], "big")
    assert size == len(middle) - 4 < len(create)
    assert _names(19, 7, middle[4:]) == ["a"]
    assert [e.api_key for e in outcome.read] == [3, 19, 18]


def test_a_delete_by_topic_id_costs_its_partitions_and_is_given_back_when_it_fails() -> None:
    m = _mutations(1.0)
    topic_id = uuid.uuid4()
    m.partitions.observe("t", topic_id, 5)
    f = ControllerMutationFilter(FakeFilterHost("alice"), m)
    cls = load_request_schema(20, 6)
    mod = __import__(cls.__module__, fromlist=["_"])
    frame = _encode(20, 6, cls(topics=(mod.DeleteTopicState(name=None, topic_id=topic_id),),
                               timeout=datetime.timedelta(seconds=5)))
    entry = _entry(frame)
    f.request_frame(entry, frame, True)
    budget = m.quotas.budgets()[0]
    assert budget.bucket.tokens == 6.0 and m.estimated == 0
    response_cls = load_response_schema(20, 6)
    rmod = __import__(response_cls.__module__, fromlist=["_"])
    from kio.schema.errors import ErrorCode

    value = response_cls(throttle_time=datetime.timedelta(0), responses=(
        rmod.DeletableTopicResult(name="t", topic_id=topic_id,  # the broker names it
                                  error_code=ErrorCode(41), error_message="not controller"),))
    buf = io.BytesIO()
    entity_writer(response_cls)(buf, value)
    f.response_frame(entry, encode_response_header(7, 1) + buf.getvalue())
    assert budget.bucket.tokens == 11.0 and m.partitions.count("t") == 5
