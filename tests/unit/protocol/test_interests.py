"""The interest table: the union of the filters' declarations, per API and version."""

from __future__ import annotations

from protocol.interests import NOTHING, Interest, InterestTable


def _routing(api_key: int, api_version: int) -> Interest:
    return Interest.CONSUMER_REQUEST_FRAME if api_key == 1 and api_version >= 11 else Interest.NONE


def _capture(api_key: int, api_version: int) -> Interest:
    if api_key == 0 and api_version >= 3:
        return Interest.PRODUCE_PARTITIONS
    return Interest.FETCH_PARTITIONS if api_key == 1 else Interest.NONE


def test_the_table_is_the_union_of_the_declarations() -> None:
    table = InterestTable([_routing, _capture])
    assert table.wants_consumer_frames and table.produce_partitions and table.fetch_partitions
    assert table.consumer_frame(1, 11) and table.consumer_frame(1, 16)
    assert not table.consumer_frame(1, 10) and not table.consumer_frame(0, 9)
    assert not table.consumer_frame(1, 999)  # a version the protocol does not know


def test_what_nobody_declares_is_not_wanted() -> None:
    only_routing = InterestTable([_routing])
    assert only_routing.wants_consumer_frames
    assert not only_routing.produce_partitions and not only_routing.fetch_partitions
    assert not NOTHING.wants_consumer_frames and not NOTHING.consumer_frame(1, 11)
    assert not NOTHING.produce_partitions and not NOTHING.fetch_partitions
