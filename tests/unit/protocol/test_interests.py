"""The interest table: the union of the filters' declarations, per API and version."""

from __future__ import annotations

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.interests import (
    ADDRESSES,
    NOTHING,
    Interest,
    InterestTable,
    addresses,
)


def _routing(api_key: int, api_version: int) -> Interest:
    return Interest.REQUEST_FRAME if api_key == 1 and api_version >= 11 else Interest.NONE


def _capture(api_key: int, api_version: int) -> Interest:
    if api_key == 0 and api_version >= 3:
        return Interest.PRODUCE_PARTITIONS
    return Interest.FETCH_PARTITIONS if api_key == 1 else Interest.NONE


def test_the_table_is_the_union_of_the_declarations() -> None:
    table = InterestTable([_routing, _capture])
    assert table.wants_request_frames and table.produce_partitions and table.fetch_partitions
    assert table.request_frame(1, 11) and table.request_frame(1, 16)
    assert not table.request_frame(1, 10) and not table.request_frame(0, 9)
    assert not table.request_frame(1, 999)  # a version the protocol does not know


def test_what_nobody_declares_is_not_wanted() -> None:
    only_routing = InterestTable([_routing])
    assert only_routing.wants_request_frames
    assert not only_routing.produce_partitions and not only_routing.fetch_partitions
    assert not NOTHING.wants_request_frames and not NOTHING.request_frame(1, 11)
    assert not NOTHING.produce_partitions and not NOTHING.fetch_partitions


def test_address_bearing_responses_are_held_whole_but_fetch_v16_streams() -> None:
    """The rewriter's declaration: every version a client may use of an API that can carry a
    broker address is rewritten (whole, or Fetch v16+ by its tagged fields), nothing else."""
    for api_key, (_, _, top, _, _) in API_TABLE.items():
        for version in range(top + 1):
            if not apis.accepts_request_version(api_key, version):
                continue
            pair = (api_key, version)
            needed = apis.needs_response_rewrite(api_key, version)
            assert (pair in ADDRESSES.response_frames or pair in ADDRESSES.response_tails) == needed
            assert not (pair in ADDRESSES.response_frames and pair in ADDRESSES.response_tails)
            assert (pair in ADDRESSES.response_tails) == (api_key == 1 and version >= 16)
    assert (3, 12) in ADDRESSES.response_frames  # Metadata
    assert (0, 10) in ADDRESSES.response_frames and (0, 9) not in ADDRESSES.response_frames
    assert not NOTHING.response_frames and not NOTHING.response_tails
    # A filter's whole-frame interest wins over the streamed tail.
    whole_fetch = InterestTable([addresses, lambda k, v: Interest.RESPONSE_FRAME * (k == 1)])
    assert (1, 16) in whole_fetch.response_frames and (1, 16) not in whole_fetch.response_tails
