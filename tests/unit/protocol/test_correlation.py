"""CorrelationTable and InFlight."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.errors import CorrelationError, ProtocolError


def entry(correlation_id: int, api_key: int = 3) -> InFlight:
    return InFlight(api_key, 12, correlation_id, "client-1", 42, True)


def test_inflight_fields_and_defaults():
    e = InFlight(1, 16, 7, None, 123, False)
    assert (e.api_key, e.api_version, e.correlation_id, e.client_id) == (1, 16, 7, None)
    assert (e.request_size, e.expects_response) == (123, False)
    assert e.response_size == 0
    assert (e.forwarded_at, e.recorded, e.route, e.refused) == (0.0, None, None, None)
    e.forwarded_at = 1.5  # set by the I/O layer
    e.response_size = 99
    assert (e.forwarded_at, e.response_size) == (1.5, 99)
    assert "api_key=1" in repr(e) and "correlation_id=7" in repr(e) and "None" in repr(e)


def test_inflight_has_slots():
    with pytest.raises(AttributeError):
        entry(1).unexpected = 1  # type: ignore[attr-defined]


def test_add_pop_contains_len():
    table = CorrelationTable()
    a, b = entry(1), entry(2)
    table.add(a)
    table.add(b)
    assert len(table) == 2 and 1 in table and 2 in table and 3 not in table
    assert table.pop(2) is b
    assert len(table) == 1 and 2 not in table
    assert table.pop(1) is a
    assert len(table) == 0


def test_duplicate_add_raises_and_keeps_first():
    table = CorrelationTable()
    first = entry(5, api_key=3)
    table.add(first)
    with pytest.raises(CorrelationError) as info:
        table.add(entry(5, api_key=9))
    assert isinstance(info.value, ProtocolError)
    assert info.value.reason == "correlation_mismatch"
    assert "5" in str(info.value)
    assert table.pop(5) is first


def test_pop_unknown_raises():
    table = CorrelationTable()
    with pytest.raises(CorrelationError):
        table.pop(1)
    table.add(entry(1))
    table.pop(1)
    with pytest.raises(CorrelationError):
        table.pop(1)  # answered once only


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(-(2**31), 2**31 - 1), unique=True, max_size=30), data=st.data())
def test_table_behaves_like_a_dict(ids: list[int], data: st.DataObject):
    table = CorrelationTable()
    entries = {cid: entry(cid) for cid in ids}
    for e in entries.values():
        table.add(e)
    order = data.draw(st.permutations(ids))
    for n, cid in enumerate(order):
        assert table.pop(cid) is entries[cid]
        assert len(table) == len(ids) - n - 1
    assert len(table) == 0
