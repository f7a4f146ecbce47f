"""Answers the proxy makes itself (``InFlight.local``) go to the client in order among the
broker's responses, never in the middle of one, and wait (with what the broker sent after
them) while ``answers_held``: the ``ResponseStream`` side of requests that never go upstream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.response_stream import Forward, ResponseStarted, ResponseStream
from testkit.frames import frame, response_frame

PRODUCE, DESCRIBE = 0, 48


def _stream(table: CorrelationTable, announce: bool = False) -> ResponseStream:
    return ResponseStream(table, lambda entry, body: None, announce=announce,
                          answer=lambda entry: entry.answer or b"")


def _entry(table: CorrelationTable, cid: int, local: bool = False) -> InFlight:
    entry = InFlight(DESCRIBE if local else PRODUCE, 1 if local else 3, cid, "c", 20, True)
    table.add(entry)
    if local:
        entry.answer = cid.to_bytes(4, "big") + b"answer-%d" % cid
        entry.local = True
        table.local += 1
    return entry


def _broker(cid: int, size: int = 30) -> bytes:
    return response_frame(PRODUCE, 3, cid, b"r" * size)


def _local(cid: int) -> bytes:
    return frame(cid.to_bytes(4, "big") + b"answer-%d" % cid)


def _run(stream: ResponseStream, data: bytes) -> tuple[bytes, list[int]]:
    f = stream.feed(data)
    return b"".join(bytes(s) for s in f.segments), [e.correlation_id for e in f.completed]


def test_an_answer_next_in_order_goes_without_the_broker() -> None:
    table = CorrelationTable()
    stream = _stream(table)
    _entry(table, 1, local=True)
    assert _run(stream, b"") == (_local(1), [1])
    assert not table and table.local == 0


def test_an_answer_goes_between_the_broker_responses_around_it() -> None:
    table = CorrelationTable()
    stream = _stream(table)
    for cid, local in ((1, False), (2, True), (3, False), (4, True)):
        _entry(table, cid, local)
    out, done = _run(stream, _broker(1) + _broker(3))
    assert out == _broker(1) + _local(2) + _broker(3) + _local(4)
    assert done == [1, 2, 3, 4] and not table


def test_an_answer_never_goes_inside_a_broker_response_under_way() -> None:
    table = CorrelationTable()
    stream = _stream(table)
    _entry(table, 1)
    _entry(table, 2, local=True)
    response = _broker(1, 500)
    assert _run(stream, response[:100]) == (response[:100], [])
    assert _run(stream, b"") == (b"", [])  # still under way: the answer waits
    assert _run(stream, response[100:]) == (response[100:] + _local(2), [1, 2])


def test_held_answers_wait_with_what_the_broker_sent_after_them() -> None:
    table = CorrelationTable()
    stream = _stream(table)
    _entry(table, 1)
    _entry(table, 2, local=True)
    _entry(table, 3)
    stream.answers_held = True
    assert _run(stream, _broker(1) + _broker(3)) == (_broker(1), [1])
    stream.answers_held = False
    assert _run(stream, b"") == (_local(2) + _broker(3), [2, 3])


def test_an_announced_answer_has_its_own_size() -> None:
    table = CorrelationTable()
    stream = _stream(table, announce=True)
    entry = _entry(table, 1, local=True)
    stream.receive_data(b"")
    event = stream.next_event()
    assert isinstance(event, ResponseStarted) and event.entry is entry
    assert entry.response_size == len(_local(1))  # what quotas and capture record
    done = stream.next_event()
    assert isinstance(done, Forward) and b"".join(map(bytes, done.segments)) == _local(1)


@given(st.lists(st.booleans(), min_size=1, max_size=12), st.data())
def test_every_response_in_request_order_however_the_bytes_come(
        local: list[bool], data: st.DataObject) -> None:
    table = CorrelationTable()
    stream = _stream(table)
    for cid, is_local in enumerate(local, 1):
        _entry(table, cid, is_local)
    wire = b"".join(_broker(c, 10 + c) for c, is_local in enumerate(local, 1) if not is_local)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=5)))
    out, done = b"", []
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        chunk, completed = _run(stream, wire[a:b])
        out += chunk
        done += completed
    expected = b"".join(_local(c) if is_local else _broker(c, 10 + c)
                        for c, is_local in enumerate(local, 1))
    assert out == expected and done == list(range(1, len(local) + 1))
