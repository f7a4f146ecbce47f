"""Setting throttle_time_ms in responses, and reading one request at a time."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.rewrite import set_throttle_time, throttle_field
from testkit.frames import kio_decode, kio_encode, kio_values, response_class, response_frame
from testkit.request_reader import reading_stream

CASES = [(0, v) for v in range(3, apis.kio_version_range(0)[1] + 1)] + [
    (1, v) for v in range(4, apis.kio_version_range(1)[1] + 1)] + [
    (3, v) for v in range(3, 13)] + [(9, 3), (11, 5), (19, 7), (60, 1)]


def test_field_locations() -> None:
    assert throttle_field(0, 3) == "produce"
    assert throttle_field(1, 12) == "first"
    assert throttle_field(3, 2) is None  # Metadata v0-2 has no throttle_time_ms
    assert throttle_field(18, 3) is None  # ApiVersions is left alone
    assert throttle_field(1, 999) is None  # a version kio does not know


@pytest.mark.parametrize(("api_key", "version"), CASES)
@settings(max_examples=15, deadline=None)
@given(data=st.data(), throttle=st.integers(1, 100_000))
def test_throttle_time_is_raised_and_nothing_else_changes(api_key: int, version: int,
                                                          data: Any, throttle: int) -> None:
    cls = response_class(api_key, version)
    value = data.draw(kio_values(cls))
    frame = response_frame(api_key, version, 5, kio_encode(value))[4:]
    entry = InFlight(api_key, version, 5, "c", 10, True)
    entry.throttle_ms = throttle
    patched = set_throttle_time(entry, frame)
    assert patched is not None and len(patched) == len(frame)
    header = len(frame) - len(kio_encode(value))
    decoded = kio_decode(cls, patched[header:])
    before = value.throttle_time // datetime.timedelta(milliseconds=1)
    after = decoded.throttle_time // datetime.timedelta(milliseconds=1)
    assert after == max(before, throttle)  # a larger value the broker set is kept
    assert dataclasses.replace(decoded, throttle_time=value.throttle_time) == value


def _frame(correlation_id: int) -> bytes:
    from testkit.frames import request_frame

    return request_frame(3, 1, correlation_id, "c", b"\x00\x00\x00\x00")


def test_stop_after_frame_holds_the_rest() -> None:
    stream = reading_stream(CorrelationTable())
    data = _frame(1) + _frame(2) + _frame(3)
    forward, events = stream.feed(data, stop_after_frame=True)
    assert bytes(forward) == _frame(1) and [e.correlation_id for e in events] == [1]
    assert stream.held and not stream.mid_frame
    forward, events = stream.feed(b"", stop_after_frame=True)
    assert bytes(forward) == _frame(2) and [e.correlation_id for e in events] == [2]
    forward, events = stream.feed(b"")  # not stopping: everything left
    assert bytes(forward) == _frame(3) and not stream.held


def test_stop_after_frame_finishes_a_frame_in_progress_first() -> None:
    stream = reading_stream(CorrelationTable())
    a, b = _frame(1), _frame(2)
    forward, events = stream.feed(a[:17])  # header read, body still coming
    assert bytes(forward) == a[:17] and stream.mid_frame and len(events) == 1
    forward, events = stream.feed(a[17:] + b, stop_after_frame=True)
    assert bytes(forward) == a[17:] and events == [] and stream.held
    forward, events = stream.feed(b"")
    assert bytes(forward) == b and [e.correlation_id for e in events] == [2]
