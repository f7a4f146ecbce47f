"""A request refused where it stands (``read_events`` with ``refused``): the frames before
it go upstream byte for byte, patched as usual; it and everything read after it go nowhere;
a refused frame not whole in the read (part of it may be upstream) cannot be cut."""

from __future__ import annotations

from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.request_stream import RequestStream
from kafka_quota_proxy.proxy.connection import read_events
from testkit.frames import request_frame


def _stream() -> RequestStream:
    # every Metadata (3) read whole and given to the visitor
    return RequestStream(CorrelationTable(), copy_frame=lambda e: e.api_key == 3,
                         whole=lambda key, version: key == 3)


def test_the_refused_frame_and_all_after_it_are_cut_out() -> None:
    first = request_frame(3, 12, 1, "c", b"\x01\x00\x00")
    refused = request_frame(3, 12, 2, "c", b"\x02\x00\x00")
    after = request_frame(18, 3, 3, "c", b"\x01\x01\x00")
    stream = _stream()
    table = stream.table
    forward, events = stream.feed(first + refused + after)
    visited: list[int] = []

    def visit(entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        visited.append(entry.correlation_id)
        return None

    outcome = read_events(forward, events, visit, None, lambda e: e.correlation_id == 2, table)
    assert outcome.forward is not None and bytes(outcome.forward) == first
    assert visited == [1, 2]  # nothing after the refused one is visited
    assert [e.correlation_id for e in outcome.read] == [1]
    assert [e.correlation_id for e in outcome.dropped] == [2, 3]


def test_patches_before_the_refused_frame_still_apply() -> None:
    first = request_frame(3, 12, 1, "c", b"\x01\x00\x00")
    refused = request_frame(3, 12, 2, "c", b"\x02\x00\x00")
    stream = _stream()
    forward, events = stream.feed(first + refused)
    longer = first[4:] + b"\x00\x00"  # a replacement of another size

    def visit(entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        return longer if entry.correlation_id == 1 else None

    outcome = read_events(forward, events, visit, None, lambda e: e.correlation_id == 2,
                          stream.table)
    assert outcome.forward is not None
    assert bytes(outcome.forward) == len(longer).to_bytes(4, "big") + longer


def test_a_refused_frame_not_whole_in_the_read_cannot_be_cut() -> None:
    refused = request_frame(3, 12, 2, "c", b"\x02\x00\x00")
    stream = _stream()
    stream.feed(refused[:10])
    _, events = stream.feed(refused[10:])  # (the frame began in the read before)
    outcome = read_events(b"", events, lambda e, f, p: None, None, lambda e: True,
                          stream.table)
    assert outcome.forward is None


def test_a_refused_produce_is_cut_in_its_place_among_the_captured_frames() -> None:
    """A Produce followed as it passed (``watched``) is given to ``produce`` in the order the
    requests were read: the captured frames before it are visited and patched, it and all
    after it cut out, from where it starts."""
    from kafka_quota_proxy.protocol.topic_guard import GuardedTopics, ProduceTopics

    topics = GuardedTopics(["guarded"])
    stream = RequestStream(CorrelationTable(), copy_frame=lambda e: e.api_key == 3,
                           whole=lambda key, version: key == 3,
                           watch_produce=lambda version: ProduceTopics(version, topics))
    first = request_frame(3, 12, 1, "c", b"\x01\x00\x00")
    damaged = request_frame(0, 9, 2, "c", b"\x01\x00\x01" + b"\xff" * 8)  # acks, then no end
    after = request_frame(3, 12, 3, "c", b"\x02\x00\x00")
    forward, events = stream.feed(first + damaged + after)
    visited: list[int] = []
    refused: list[InFlight] = []

    def visit(entry: InFlight, frame: bytes, patchable: bool) -> bytes | None:
        visited.append(entry.correlation_id)
        return frame[:-1] + b"\x01"  # (same size: patched in place)

    def produce(entry: InFlight, watch: object) -> None:
        visited.append(entry.correlation_id)
        refused.append(entry)

    outcome = read_events(forward, events, visit, produce, lambda e: e in refused, stream.table)
    assert outcome.forward is not None and bytes(outcome.forward) == first[:-1] + b"\x01"
    assert visited == [1, 2]
    assert [e.correlation_id for e in outcome.dropped] == [2, 3]


def test_a_refused_produce_begun_in_an_earlier_read_cannot_be_cut() -> None:
    from kafka_quota_proxy.protocol.topic_guard import GuardedTopics, ProduceTopics

    topics = GuardedTopics(["guarded"])
    stream = RequestStream(CorrelationTable(),
                           watch_produce=lambda version: ProduceTopics(version, topics))
    damaged = request_frame(0, 9, 2, "c", b"\x01\x00\x01\x00\x00\x00\x00" + b"\xff" * 8)
    stream.feed(damaged[:20])
    forward, events = stream.feed(damaged[20:])
    assert [type(e).__name__ for e in events] == ["ProduceWatched"] and events[0].at == -1
    outcome = read_events(forward, events, lambda e, f, p: None, lambda e, w: None,
                          lambda e: True, stream.table)
    assert outcome.forward is None
