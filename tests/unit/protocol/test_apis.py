"""apis.py: the version table, what the proxy offers and accepts, ADDRESS_BEARING."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from kio.index import load_response_schema
from kio.schema.index import api_key_map, schema_name_map

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.apis import ADDRESS_BEARING, ApiKey

PRODUCE, FETCH, METADATA, OFFSET_FETCH, FIND_COORDINATOR = 0, 1, 3, 9, 10
SASL_HANDSHAKE, API_VERSIONS, DESCRIBE_QUORUM, DESCRIBE_CLUSTER = 17, 18, 55, 60
SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79


def kio_max(api_key: int) -> int:
    return API_TABLE[api_key][2]


# --------------------------------------------------------------------------- table vs kio


def test_api_table_is_in_sync_with_installed_kio():
    assert set(API_TABLE) == set(api_key_map)
    for key, (name, lo, hi, _rq, _rs) in API_TABLE.items():
        assert api_key_map[key] == name
        assert (lo, hi) == (min(schema_name_map[name]), max(schema_name_map[name]))
        assert apis.kio_version_range(key) == (lo, hi)


def test_api_key_enum_values():
    assert {k.name: int(k) for k in ApiKey} == {
        "PRODUCE": 0, "FETCH": 1, "METADATA": 3, "FIND_COORDINATOR": 10, "SASL_HANDSHAKE": 17,
        "API_VERSIONS": 18, "SASL_AUTHENTICATE": 36, "DESCRIBE_QUORUM": 55, "DESCRIBE_CLUSTER": 60,
        "SHARE_FETCH": 78,
        "SHARE_ACKNOWLEDGE": 79,
    }
    for k in ApiKey:
        assert api_key_map[int(k)] == k.name.lower()


def test_is_known_and_api_name():
    assert apis.is_known(METADATA) and apis.api_name(METADATA) == "metadata"
    for key in (4, 5, 6, 7, -1, 9999):
        assert not apis.is_known(key)
        assert apis.api_name(key) == f"unknown_{key}"


# --------------------------------------------------------------------------- offered_range


@pytest.mark.parametrize(
    ("api_key", "broker", "offered"),
    [
        (PRODUCE, (0, 99), (0, kio_max(PRODUCE))),
        (PRODUCE, (3, 9), (3, 9)),
        (FETCH, (0, 99), (0, kio_max(FETCH))),
        (METADATA, (0, 99), (0, kio_max(METADATA))),
        (METADATA, (0, 5), (0, 5)),
        (FIND_COORDINATOR, (0, 99), (0, kio_max(FIND_COORDINATOR))),
        (DESCRIBE_CLUSTER, (0, 99), (0, kio_max(DESCRIBE_CLUSTER))),
        (SHARE_FETCH, (1, 99), (1, kio_max(SHARE_FETCH))),
        (SHARE_FETCH, (0, 99), (1, kio_max(SHARE_FETCH))),  # v0 cannot be decoded
        (SHARE_FETCH, (0, 0), None),
        (SHARE_ACKNOWLEDGE, (0, 0), None),
        (API_VERSIONS, (0, 99), (0, 99)),  # not capped: only its api_keys array is edited
        (SASL_HANDSHAKE, (0, 1), (1, 1)),
        (SASL_HANDSHAKE, (0, 0), None),
        (36, (0, 3), (0, kio_max(36))),  # SaslAuthenticate: read by SASL inspection
        (DESCRIBE_QUORUM, (0, 2), (0, 1)),
        (DESCRIBE_QUORUM, (2, 2), None),
        (OFFSET_FETCH, (0, 99), (0, 99)),  # pass-through API: the broker's range
        (2, (0, 99), (0, 99)),
        (7, (0, 3), None),  # ControlledShutdown: unknown to kio, hidden
        (9999, (0, 0), None),
        (-1, (0, 0), None),
    ],
)
def test_offered_range(api_key: int, broker: tuple[int, int], offered: tuple[int, int] | None):
    assert apis.offered_range(api_key, *broker) == offered


@pytest.mark.parametrize("api_key", sorted(API_TABLE))
def test_offered_versions_are_exactly_the_accepted_ones(api_key: int):
    """Whatever the broker offers, every version the proxy offers is one it accepts, and every
    broker version it hides (within the broker's range) is one it rejects."""
    for broker_lo, broker_hi in ((0, 40), (0, 0), (1, 3), (5, 40)):
        offered = apis.offered_range(api_key, broker_lo, broker_hi)
        for v in range(broker_lo, broker_hi + 1):
            inside = offered is not None and offered[0] <= v <= offered[1]
            assert inside == apis.accepts_request_version(api_key, v), (api_key, v, offered)


# --------------------------------------------------------------------------- accepts


@pytest.mark.parametrize(
    ("api_key", "version", "accepted"),
    [
        (PRODUCE, 0, True),  # v0-9 need no rewrite: forwarded whatever kio knows
        (PRODUCE, 9, True),
        (PRODUCE, kio_max(PRODUCE), True),
        (PRODUCE, kio_max(PRODUCE) + 1, False),
        (FETCH, 0, True),
        (FETCH, kio_max(FETCH), True),
        (FETCH, kio_max(FETCH) + 1, False),
        (METADATA, 0, True),
        (METADATA, kio_max(METADATA) + 1, False),
        (FIND_COORDINATOR, kio_max(FIND_COORDINATOR) + 1, False),
        (DESCRIBE_CLUSTER, kio_max(DESCRIBE_CLUSTER) + 1, False),
        (SHARE_FETCH, 0, False),  # below kio's range: the response could not be rewritten
        (SHARE_FETCH, 1, True),
        (SHARE_ACKNOWLEDGE, 0, False),
        (API_VERSIONS, 0, True),
        (API_VERSIONS, 4, True),
        (API_VERSIONS, 9, True),  # any version: the broker answers v0 with error 35 if need be
        (SASL_HANDSHAKE, 0, False),
        (SASL_HANDSHAKE, 1, True),
        (DESCRIBE_QUORUM, 1, True),
        (DESCRIBE_QUORUM, 2, False),
        (OFFSET_FETCH, 99, True),  # pass-through
        (OFFSET_FETCH, -1, False),
        (METADATA, -1, False),
    ],
)
def test_accepts_request_version(api_key: int, version: int, accepted: bool):
    assert apis.accepts_request_version(api_key, version) is accepted


# --------------------------------------------------------------------------- address bearing


def test_address_bearing_thresholds():
    assert dict(ADDRESS_BEARING) == {
        API_VERSIONS: 0, METADATA: 0, FIND_COORDINATOR: 0, DESCRIBE_CLUSTER: 0,
        PRODUCE: 10, FETCH: 16, SHARE_FETCH: 0, SHARE_ACKNOWLEDGE: 0,
    }
    assert not apis.needs_response_rewrite(PRODUCE, 9)
    assert apis.needs_response_rewrite(PRODUCE, 10)
    assert not apis.needs_response_rewrite(FETCH, 15)
    assert apis.needs_response_rewrite(FETCH, 16)
    assert apis.needs_response_rewrite(METADATA, 0)
    assert apis.needs_response_rewrite(API_VERSIONS, 0)
    assert not apis.needs_response_rewrite(OFFSET_FETCH, 5)
    assert not apis.needs_response_rewrite(9999, 0)


def _has_field(cls: type, name: str, seen: set[type] | None = None) -> bool:
    seen = set() if seen is None else seen
    if cls in seen:
        return False
    seen.add(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == name:
            return True
        for t in (hints[f.name], *typing.get_args(hints[f.name])):
            for u in (t, *typing.get_args(t)):
                if dataclasses.is_dataclass(u) and _has_field(u, name, seen):
                    return True
    return False


ALL_VERSIONS = [(k, v) for k, e in sorted(API_TABLE.items()) for v in range(e[1], e[2] + 1)]

# Responses whose "host" is not a broker's address.
NOT_BROKER_ADDRESSES = {
    29: "DescribeAcls: the ACL's host pattern",
    31: "DeleteAcls: the ACL's host pattern",
    88: "StreamsGroupHeartbeat: Kafka Streams application (IQ) endpoints",
    89: "StreamsGroupDescribe: Kafka Streams application (IQ) endpoints",
}
# KRaft controller-to-controller RPCs: their responses carry controller endpoints, but only a
# controller listener serves them, never the broker listeners the proxy fronts. They are
# forwarded unrewritten; listed here so that a new host-bearing response cannot slip in.
CONTROLLER_ONLY = {
    52: "Vote",
    53: "BeginQuorumEpoch",
    54: "EndQuorumEpoch",
    59: "FetchSnapshot",
    82: "UpdateRaftVoter",
}


def _carries_host(api_key: int, version: int) -> bool:
    return _has_field(load_response_schema(api_key, version), "host")


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS)
def test_every_response_with_a_host_is_rewritten_or_refused(api_key: int, version: int):
    """No response version kio knows carries a broker address to the client unrewritten: it
    either needs rewriting (and the proxy accepts it) or the proxy refuses that version."""
    if api_key in NOT_BROKER_ADDRESSES or api_key in CONTROLLER_ONLY:
        return
    if not _carries_host(api_key, version):
        return
    assert (
        apis.needs_response_rewrite(api_key, version)
        or not apis.accepts_request_version(api_key, version)
    ), f"{api_key_map[api_key]} v{version} carries a host"


def test_host_exemptions_are_still_needed():
    for api_key in [*NOT_BROKER_ADDRESSES, *CONTROLLER_ONLY]:
        lo, hi = apis.kio_version_range(api_key)
        assert any(_carries_host(api_key, v) for v in range(lo, hi + 1)), api_key
        assert not apis.needs_response_rewrite(api_key, hi)
    # DescribeQuorum v2 lists controller endpoints too; it is capped at v1 instead.
    assert _carries_host(DESCRIBE_QUORUM, 2) and not _carries_host(DESCRIBE_QUORUM, 1)
    assert not apis.accepts_request_version(DESCRIBE_QUORUM, 2)


def test_flexible_helpers():
    assert apis.request_is_flexible(METADATA, 9) and not apis.request_is_flexible(METADATA, 8)
    assert apis.response_is_flexible(FETCH, 12) and not apis.response_is_flexible(FETCH, 11)
    assert not apis.request_is_flexible(SASL_HANDSHAKE, 1)  # never flexible (-1)
    assert not apis.response_is_flexible(9999, 5)
