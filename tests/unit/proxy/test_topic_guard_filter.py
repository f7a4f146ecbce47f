"""The topic guard filter on one connection: what it does with a request frame naming the
proxy's topics (rewritten, answered, or the connection closed when it cannot be), and the
controller mutation quota after it counting only what goes on."""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.decoded import response_body
from kafka_quota_proxy.protocol.mutation_frames import decode_request
from kafka_quota_proxy.protocol.topic_fields import TOPIC_AUTHORIZATION_FAILED, read_topics
from kafka_quota_proxy.proxy.features.topic_guard.filter import TopicGuardFilter
from kafka_quota_proxy.proxy.features.topic_guard.guard import Results, TopicGuard
from testkit.filter_host import FakeFilterHost
from testkit.frames import create_topics_request, request_frame

GUARDED = "__kafka_quota_proxy_quotas"


def _filter() -> tuple[TopicGuardFilter, FakeFilterHost, TopicGuard]:
    host = FakeFilterHost("mallory")
    guard = TopicGuard([GUARDED, "__kafka_quota_proxy_usage"])
    return TopicGuardFilter(host, guard), host, guard  # type: ignore[arg-type]


def _entry(api_key: int, version: int, frame: bytes) -> InFlight:
    return InFlight(api_key, version, 7, "admin", len(frame) + 4, True)


def test_a_mixed_request_goes_on_without_the_guarded_topic() -> None:
    f, host, guard = _filter()
    frame = create_topics_request([(GUARDED, 1), ("orders", 3)])
    entry = _entry(19, 7, frame)
    out = f.request_frame(entry, frame, True)
    assert out is not None and entry.answer is None and not host.close_reasons
    assert [t.name for t in decode_request(out, 19, 7).topics] == ["orders"]
    assert isinstance(entry.refused, Results)
    assert [r.name for r in entry.refused.refs] == [GUARDED]
    assert guard.refused == {"create_topics": 1}


def test_a_request_of_guarded_topics_only_is_answered_by_the_proxy() -> None:
    f, host, _ = _filter()
    frame = create_topics_request([(GUARDED, 1)])
    entry = _entry(19, 7, frame)
    assert f.request_frame(entry, frame, True) is None and not host.close_reasons
    assert read_topics(frame, 19, 7).correlation_id == 7
    assert entry.answer is not None
    answer: Any = response_body(entry.answer, 19, 7)
    assert [(t.name, int(t.error_code)) for t in answer.topics] == [
        (GUARDED, TOPIC_AUTHORIZATION_FAILED)]


def test_what_cannot_be_rewritten_closes_the_connection() -> None:
    f, host, guard = _filter()
    frame = create_topics_request([(GUARDED, 1), ("orders", 3)])
    assert f.request_frame(_entry(19, 7, frame), frame, False) is None  # not read whole
    old_fetch = request_frame(1, 3, 7, "c", b"\x00" * 20 + GUARDED.encode())[4:]
    assert f.request_frame(_entry(1, 3, old_fetch), old_fetch, True) is None  # no schema
    assert host.close_reasons == ["guarded_topic", "guarded_topic"]
    assert guard.closed == {"frame_too_large": 1, "version_not_decoded": 1}


def test_frames_without_the_names_are_not_decoded() -> None:
    f, host, guard = _filter()
    frame = create_topics_request([("orders", 3)])
    entry = _entry(19, 7, frame)
    assert f.request_frame(entry, frame, True) is None
    assert entry.refused is None and not host.close_reasons and not guard.refused


def test_the_mutation_quota_counts_what_goes_on() -> None:
    """The controller mutation filter after the guard sees the request without the guarded
    topic (the connection passes each filter the frame the ones before it left)."""
    from kafka_quota_proxy.config.schema import QuotasConfig
    from kafka_quota_proxy.proxy.features.controller_mutation.filter import ControllerMutationFilter
    from kafka_quota_proxy.proxy.features.controller_mutation.mutations import ControllerMutations

    f, _, _ = _filter()
    mutations = ControllerMutations(QuotasConfig.model_validate({
        "entities": [{"user": "alice", "controller_mutation_rate": 100.0}]}))
    m = ControllerMutationFilter(FakeFilterHost("alice"), mutations)  # type: ignore[arg-type]
    frame = create_topics_request([(GUARDED, 1), ("orders", 3)])
    entry = _entry(19, 7, frame)
    out = f.request_frame(entry, frame, True)
    assert out is not None
    assert m.request_frame(entry, out, True) is None
    assert sum(mutations.recorded.values()) == 3.0
