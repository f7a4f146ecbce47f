"""Every request read under its own client-id: with ``gate_client_ids`` a read stops before a
frame of another client-id than ``client_id`` (a connection's first frame too), holding it
unforwarded and naming it in ``next_client_id``; nothing is lost or reordered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.correlation import CorrelationTable
from testkit.frames import request_frame, split
from testkit.request_reader import reading_stream


def _frames(client_ids: list[str | None]) -> bytes:
    return b"".join(request_frame(18, 0, i, cid) for i, cid in enumerate(client_ids))


def test_the_first_frame_and_a_new_client_id_stop_a_read() -> None:
    stream = reading_stream(CorrelationTable())
    stream.gate_client_ids()
    data = _frames(["a", "a", "b", None])
    forward, events = stream.feed(data)
    assert (bytes(forward), events, stream.next_client_id) == (b"", [], "a")
    stream.client_id, stream.next_client_id = "a", None
    forward, events = stream.feed(b"")
    assert [e.client_id for e in events] == ["a", "a"] and stream.next_client_id == "b"
    stream.client_id, stream.next_client_id = "b", None
    forward2, events = stream.feed(b"")
    assert [e.client_id for e in events] == ["b"] and stream.next_client_id == ""  # null
    stream.client_id, stream.next_client_id = "", None
    forward3, events = stream.feed(b"")
    assert [e.client_id for e in events] == [None] and not stream.held
    assert bytes(forward) + bytes(forward2) + bytes(forward3) == data


def test_without_the_gate_every_frame_is_read() -> None:
    stream = reading_stream(CorrelationTable())
    _, events = stream.feed(_frames(["a", "b"]))
    assert len(events) == 2 and stream.next_client_id is None


@given(st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=12),
       st.lists(st.integers(0, 400), max_size=8))
def test_gated_reads_lose_and_reorder_nothing(client_ids: list[str | None],
                                              cuts: list[int]) -> None:
    stream = reading_stream(CorrelationTable())
    stream.gate_client_ids()
    data = _frames(client_ids)
    out = bytearray()
    seen: list[str | None] = []
    for chunk in split(data, cuts):
        pending = chunk
        while True:
            forward, events = stream.feed(pending)
            pending = b""
            out += bytes(forward)
            for e in events:
                assert (e.client_id or "") == stream.client_id  # read under its own
            seen += [e.client_id for e in events]
            if stream.next_client_id is None:
                break
            stream.client_id, stream.next_client_id = stream.next_client_id, None
    assert bytes(out) == data and seen == client_ids
