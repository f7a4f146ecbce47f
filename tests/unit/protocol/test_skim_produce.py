"""A Produce request read whole is skimmed once (``skim_produce_request``) for every follower
instead of being walked field by field: what the skim gives is exactly what the walks give
(the partitions the capture measures, the topics the guard refuses and where it spoils them),
for well-formed frames of every version and for any damage a client may do to one. Where the
skim cannot tell, it says so (None) and the walks decide, as for a frame read in pieces."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from kafka_quota_proxy.protocol.correlation import CorrelationTable
from kafka_quota_proxy.protocol.headers import encode_request_header
from kafka_quota_proxy.protocol.incremental import (
    RecordsTail,
    Walk,
    Walker,
    _skip,
    _skip_tagged_fields,
    produce_request_walk,
    produce_tail,
)
from kafka_quota_proxy.protocol.skim import skim_produce_prefix, skim_produce_request
from kafka_quota_proxy.protocol.topic_fields import encode
from kafka_quota_proxy.protocol.topic_guard import ProduceTopics
from testkit.frames import damaged_tagged_sections, follow_in_pieces, frame
from testkit.request_reader import reading_stream

VERSIONS = list(range(3, 14))
REFUSED_NAME = "__kafka_quota_proxy_quotas"
REFUSED_ID = uuid.UUID(int=0xABCDEF)
REFUSED_TXN = "forbidden-txn"


class Refusing:
    """(``RefusedTopics``) One name, one id and one transactional id refused."""

    def refuses_name(self, raw: bytes) -> bool:
        return raw == REFUSED_NAME.encode()

    def refuses_id(self, raw: bytes) -> bool:
        return raw == REFUSED_ID.bytes

    def refuses_transaction(self, raw: bytes) -> bool:
        return raw == REFUSED_TXN.encode()


def produce_tail_walk(records: int, flexible: bool) -> Walk:
    """What a Produce walk (``produce_request_walk``, the topic guard's) does from the start
    of a frame's last partition's records on: the reference ``produce_tail`` is held to."""
    yield from _skip(records)
    if flexible:
        yield from _skip_tagged_fields()  # the partition's
        yield from _skip_tagged_fields()  # the topic's
        yield from _skip_tagged_fields()  # the request's


def _produce(version: int, topics: list[tuple[str | uuid.UUID, list[bytes | None]]],
             transactional_id: str | None = None) -> bytes:
    m = __import__(load_request_schema(0, version).__module__, fromlist=["_"])
    key = "name" if version < 13 else "topic_id"
    data = tuple(m.TopicProduceData(**{key: t}, partition_data=tuple(
        m.PartitionProduceData(index=7 * i + 1, records=r) for i, r in enumerate(parts)))
        for t, parts in topics)
    value = m.ProduceRequest(transactional_id=transactional_id, acks=1,
                             timeout=timedelta(seconds=5), topic_data=data)
    return frame(encode_request_header(0, version, 3, "p") + encode(value))


def _walked(buf: bytes, end: int, version: int) -> tuple[Any, Any]:
    """What the walks find in ``buf[4:end]``: (the partitions measured or None where the walk
    did not finish, the guard's findings or None where it failed or did not finish)."""
    parts: list[Any] = []
    walker = Walker(produce_request_walk(version, parts))
    try:
        walker.feed(buf, 4, end)
        measured = parts if walker.done else None
    except ValueError:
        measured = None
    guard = ProduceTopics(version, Refusing())
    guard.feed(buf, 4, end)
    found = (None if guard.failed or not guard.done
             else (guard.refused, guard.spoil, guard.error_code))
    return measured, found


def _skimmed(buf: bytes, end: int, version: int) -> tuple[Any, Any] | None:
    skim = skim_produce_request(buf, 4, end, version)
    if skim is None:
        return None
    measured = [(name if version >= 13 else name.decode("utf-8", "replace"), index,
                 max(size, 0)) for name, _, parts in skim.topics for index, size in parts]
    guard = ProduceTopics(version, Refusing())
    guard.skimmed(skim)
    assert guard.done
    return measured, None if guard.failed else (guard.refused, guard.spoil, guard.error_code)


def _prefixed(buf: bytes, n: int, end: int, version: int) -> tuple[Any, Any] | None:
    """What the followers find in ``buf[4:end]`` when only ``buf[:n]`` had arrived at its
    start: the prefix skimmed, then only the tail walked from its last records on (None
    where the prefix cannot be skimmed: the walks follow the frame)."""
    prefix = skim_produce_prefix(buf[:n], 4, n, end, version)
    if prefix is None:
        return None
    assert prefix.records_at <= n < prefix.records_at + prefix.records
    flexible = version >= 9
    measured: Any = [(name if version >= 13 else name.decode("utf-8", "replace"), index,
                      max(size, 0)) for name, _, parts in prefix.skim.topics
                     for index, size in parts]
    walker = produce_tail(prefix.records, flexible)
    try:
        walker.feed(buf, prefix.records_at, end)
        measured = measured if walker.done else None
    except ValueError:
        measured = None
    guard = ProduceTopics(version, Refusing())
    guard.skimmed(prefix.skim, produce_tail(prefix.records, flexible))
    guard.feed(buf, prefix.records_at, end)
    found = (None if guard.failed or not guard.done
             else (guard.refused, guard.spoil, guard.error_code))
    return measured, found


def _topics(version: int) -> Any:
    name = (st.sampled_from([REFUSED_NAME, "orders", "", "ü-topic"]) if version < 13
            else st.sampled_from([REFUSED_ID, uuid.UUID(int=5), uuid.UUID(int=0)]))
    records = st.one_of(st.none(), st.binary(max_size=300))
    return st.lists(st.tuples(name, st.lists(records, max_size=4)), max_size=4)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_skim_finds_what_the_walks_find(version: int, data: Any) -> None:
    topics = data.draw(_topics(version))
    txn = data.draw(st.sampled_from([None, "", "a-txn", REFUSED_TXN]))
    buf = _produce(version, topics, txn)
    trailing = data.draw(st.binary(max_size=20))  # (the next frame's bytes, in the same read)
    skimmed = _skimmed(buf + trailing, len(buf), version)
    assert skimmed is not None
    assert skimmed == _walked(buf, len(buf), version)
    measured, (refused, _, _) = skimmed
    assert len(measured) == sum(len(parts) for _, parts in topics)
    assert bool(refused) == any(t in (REFUSED_NAME, REFUSED_ID) or (txn == REFUSED_TXN and t)
                                for t, _ in topics)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_damaged_frame_is_skimmed_as_walked_or_left_to_the_walks(version: int,
                                                                  data: Any) -> None:
    """Bytes changed, cut or added by a hostile client: the skim gives what the walks give,
    or nothing; never a finding the walks would not make (and never reads past the frame:
    the bytes after it belong to the next one)."""
    topics = data.draw(_topics(version))
    buf = bytearray(_produce(version, topics, data.draw(st.sampled_from([None, "t"]))))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(4, len(buf) - 1))
        buf[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, buf[at] ^ 0x40]))
    end = data.draw(st.integers(4, len(buf)))
    after = bytes(buf) + data.draw(st.binary(max_size=40))
    skimmed = _skimmed(after, end, version)
    if skimmed is not None:
        assert skimmed == _walked(bytes(buf[:end]), end, version)


def test_a_frame_read_whole_is_skimmed_and_one_read_in_pieces_is_walked() -> None:
    """Through the request stream: the whole frame's guard never walks; the same frame in
    two reads is walked; both find the same."""
    original = _produce(9, [("orders", [b"x" * 500]), (REFUSED_NAME, [b"y" * 10, None])])
    results = []
    for cut in (len(original), 50):
        stream = reading_stream(CorrelationTable(), measure_produce=True,
                                watch_produce=lambda version: ProduceTopics(version, Refusing()))
        forward = bytes(stream.feed(original[:cut])[0]) + bytes(stream.feed(original[cut:])[0])
        [(_, watch)] = stream.watched
        assert (watch.walker.at == 0) == (cut == len(original))  # (at: where a walk read)
        results.append((forward, [e.partitions for e in stream.measured],
                        watch.refused, watch.error_code))
    assert results[0] == results[1]
    forward, measured, refused, _ = results[0]
    assert measured == [[("orders", 1, 500), (REFUSED_NAME, 1, 10), (REFUSED_NAME, 8, 0)]]
    assert refused == [(REFUSED_NAME, None, [1, 8])]
    assert REFUSED_NAME.encode() not in forward  # (spoiled on its way upstream)


@pytest.mark.parametrize("version", [3, 9, 12])
def test_a_refused_name_that_is_not_utf8_fails_the_frame_as_the_walk_does(version: int) -> None:
    """Every topic of a refused transaction is refused by name: one whose name is not UTF-8
    fails the frame (it is refused and the connection closes), skimmed or walked."""
    buf = bytearray(_produce(version, [("orders", [b"x"]), ("bad-name", [b"y"])], REFUSED_TXN))
    buf[buf.index(b"bad-name")] = 0xFF
    skimmed = _skimmed(bytes(buf), len(buf), version)
    assert skimmed is not None and skimmed[1] is None  # (failed)
    assert skimmed == _walked(bytes(buf), len(buf), version)
    stream = reading_stream(CorrelationTable(), measure_produce=True,
                            watch_produce=lambda v: ProduceTopics(v, Refusing()))
    stream.feed(bytes(buf))
    [(_, watch)] = stream.watched
    assert watch.failed


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_frame_skimmed_before_its_last_records_arrive_finds_what_the_walks_find(
        version: int, data: Any) -> None:
    """A large request's first read holds all of it but its last partition's records: the
    prefix is skimmed and only the tail walked, finding what the walks find; a read that
    ends elsewhere (before that, or with records of another partition still to come) is left
    to the walks."""
    topics = data.draw(_topics(version))
    last = data.draw(st.binary(min_size=2, max_size=300))
    topics.append((data.draw(_topics(version).map(lambda t: t[0][0] if t else "orders")
                             if version < 13 else st.just(REFUSED_ID)), [last]))
    txn = data.draw(st.sampled_from([None, "", "a-txn", REFUSED_TXN]))
    buf = _produce(version, topics, txn)
    tail = 3 if version >= 9 else 0
    inside = len(buf) - tail - 1  # (a cut inside the last records)
    prefixed = _prefixed(buf, inside, len(buf), version)
    assert prefixed is not None
    assert prefixed == _walked(buf, len(buf), version)
    n = data.draw(st.integers(4, len(buf) - 1))
    prefixed = _prefixed(buf, n, len(buf), version)
    if prefixed is not None:
        assert prefixed == _walked(buf, len(buf), version)
    elif len(buf) - tail - len(last) < n <= inside:
        raise AssertionError(f"a cut at {n}, inside the last records, was not skimmed")


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_damaged_frame_skimmed_before_its_end_is_skimmed_as_walked_or_left_to_the_walks(
        version: int, data: Any) -> None:
    """Bytes changed by a hostile client, the frame cut at any read: the prefix skim and its
    tail walk give what the walks give, or leave the frame to them."""
    topics = data.draw(_topics(version))
    topics.append(("orders" if version < 13 else uuid.UUID(int=5),
                   [data.draw(st.binary(min_size=2, max_size=300))]))
    buf = bytearray(_produce(version, topics, data.draw(st.sampled_from([None, "t"]))))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(4, len(buf) - 1))
        buf[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, buf[at] ^ 0x40]))
    end = data.draw(st.integers(5, len(buf)))
    n = data.draw(st.integers(4, end - 1))
    prefixed = _prefixed(bytes(buf), n, end, version)
    if prefixed is not None:
        assert prefixed == _walked(bytes(buf[:end]), end, version)


@pytest.mark.parametrize("version", [7, 9, 13])
def test_a_large_request_is_skimmed_at_its_first_read_and_only_its_tail_walked(
        version: int) -> None:
    """Through the request stream, a librdkafka-sized request to a refused topic in reads of
    16 KiB: its first read is skimmed, and the guard walks only what follows its records;
    what goes upstream, what is measured and what is refused are what one read finds."""
    topic = REFUSED_NAME if version < 13 else REFUSED_ID
    original = _produce(version, [(topic, [b"r" * 200_000])])
    results = []
    for piece in (len(original), 16384):
        stream = reading_stream(CorrelationTable(), measure_produce=True,
                                watch_produce=lambda v: ProduceTopics(v, Refusing()))
        forward = b"".join(bytes(stream.feed(original[i:i + piece])[0])
                           for i in range(0, len(original), piece))
        [(_, watch)] = stream.watched
        if piece < len(original):
            assert isinstance(watch.walker, RecordsTail)
            assert watch.walker._walker is None  # (its sections read straight, not walked)
        results.append((forward, [e.partitions for e in stream.measured],
                        watch.refused, watch.failed))
    assert results[0] == results[1]
    forward, measured, refused, failed = results[0]
    assert not failed and measured == [[(topic if version < 13 else topic.bytes, 1, 200_000)]]
    assert refused == [(REFUSED_NAME, None, [1])] if version < 13 else [(None, REFUSED_ID, [1])]
    spoiled = REFUSED_NAME.encode() if version < 13 else REFUSED_ID.bytes
    assert spoiled not in forward and len(forward) == len(original)


def test_a_large_tagged_field_after_the_records_is_passed_not_held() -> None:
    """A client may put a large tagged field after its records (the partition's section):
    the followers of a request skimmed at its first read skip it as it passes, as the walk
    does (the stream lets it go by unread), and hold none of it; the request is measured
    and forwarded whole."""
    from kafka_quota_proxy.protocol.primitives import write_uvarint
    from kafka_quota_proxy.protocol.request_stream import RequestStream

    version = 9
    plain = _produce(version, [("orders", [b"r" * 200_000])])
    assert plain.endswith(b"\x00\x00\x00")  # the partition's, topic's, request's sections
    big = write_uvarint(1) + write_uvarint(99) + write_uvarint(300_000) + b"t" * 300_000
    body = plain[4:-3] + big + b"\x00\x00"
    original = len(body).to_bytes(4, "big") + body
    table = CorrelationTable()
    stream = RequestStream(table, measure_produce=True,
                           watch_produce=lambda v: ProduceTopics(v, Refusing()))
    fed = passed = 0
    forward = []
    measured = []
    i = 0
    while i < len(original):
        k = stream.passable()
        if k:
            stream.passed(k)
            forward.append(original[i:i + k])
            passed += k
            i += k
            continue
        chunk = original[i:i + 16384]
        out, events = stream.feed(chunk)
        forward.append(bytes(out))
        measured += [e.entry.partitions for e in events if type(e).__name__ == "ProduceMeasured"]
        fed += len(chunk)
        i += len(chunk)
    assert b"".join(forward) == original
    assert measured == [[("orders", 1, 200_000)]]
    # the records and the field went by unread, but for the reads that began each
    assert passed > 500_000 - 3 * 16384 and fed <= 4 * 16384, (passed, fed)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_tail_follower_finds_what_the_tail_walk_finds(data: Any) -> None:
    """``produce_tail`` against the walks' own steps (``produce_tail_walk``) over the same
    bytes, records passed unseen or fed, in any pieces: at the frame's end both are done,
    or neither, or both fail."""
    flexible = data.draw(st.booleans())
    records = data.draw(st.integers(0, 50))
    tail = damaged_tagged_sections(data.draw)  # (what follows the records: a classic frame
    buf = b"r" * records + tail                  # has none)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(buf)), max_size=4)))
    pieces = list(zip([0, *cuts], [*cuts, len(buf)], strict=True))
    results = []
    for follower in (Walker(produce_tail_walk(records, flexible)),
                     produce_tail(records, flexible)):
        reached, done = follow_in_pieces(follower, buf, pieces)
        results.append("failed" if reached[-1:] == ["failed"] else done)
    assert results[0] == results[1]
