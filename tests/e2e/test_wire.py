"""Raw-protocol probes through the proxy: every version of every address-bearing API the
proxy offers comes back with proxy addresses only, and ApiVersions is capped."""

from __future__ import annotations

import uuid

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from testkit.e2e import KafkaWire, ProxyProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def offered(proxy: ProxyProcess) -> dict[int, tuple[int, int]]:
    with KafkaWire("127.0.0.1", proxy.bootstrap_port) as wire:
        response = wire.request(18, 3, client_software_name="probe", client_software_version="1")
    assert response.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


@pytest.fixture(scope="module")
def broker_offered(tansu: TansuBroker) -> dict[int, tuple[int, int]]:
    host, port = tansu.bootstrap.split(":")
    with KafkaWire(host, int(port)) as wire:
        response = wire.request(18, 3, client_software_name="probe", client_software_version="1")
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def test_api_versions_offers_only_what_proxy_and_broker_handle(
    offered: dict[int, tuple[int, int]], broker_offered: dict[int, tuple[int, int]]
) -> None:
    assert offered, "empty ApiVersions"
    for key, (lo, hi) in offered.items():
        assert key in API_TABLE, f"api key {key} unknown to the proxy is offered"
        if key in apis.ANSWERED_BY_PROXY:  # answered by the proxy, whatever the broker says
            assert (lo, hi) == apis.ANSWERED_BY_PROXY[key]
            continue
        assert key in broker_offered
        b_lo, b_hi = broker_offered[key]
        assert b_lo <= lo <= hi <= b_hi
        expected = apis.offered_range(key, b_lo, b_hi)
        assert (lo, hi) == expected
    for key in (3, 10, 60):
        if key in offered:
            assert offered[key][1] <= API_TABLE[key][2]
    hidden = set(broker_offered) - set(offered)
    assert all(apis.offered_range(k, *broker_offered[k]) is None for k in hidden)


def _versions(offered: dict[int, tuple[int, int]], key: int) -> range:
    lo, hi = offered[key]
    return range(max(lo, API_TABLE[key][1]), hi + 1)


def test_metadata_every_version_has_proxy_addresses(
    proxy: ProxyProcess, tansu: TansuBroker, offered: dict[int, tuple[int, int]]
) -> None:
    versions = _versions(offered, 3)
    assert len(versions) >= 5
    with KafkaWire("127.0.0.1", proxy.bootstrap_port) as wire:
        for v in versions:
            response = wire.request(
                3,
                v,
                topics=None if v >= 1 else (),
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
            assert response.brokers, f"Metadata v{v}: no brokers"
            for b in response.brokers:
                assert (b.host, b.port) == ("127.0.0.1", proxy.broker_port(b.node_id)), v
                assert b.port != tansu.port


def test_find_coordinator_every_version_has_proxy_addresses(
    proxy: ProxyProcess, tansu: TansuBroker, offered: dict[int, tuple[int, int]]
) -> None:
    group = f"probe-{uuid.uuid4().hex[:6]}"
    versions = _versions(offered, 10)
    assert len(versions) >= 2
    port = proxy.broker_port(111)
    with KafkaWire("127.0.0.1", port) as wire:
        for v in versions:
            response = wire.request(10, v, key=group, key_type=0, coordinator_keys=(group,))
            if v >= 4:
                assert response.coordinators
                for c in response.coordinators:
                    assert c.error_code == 0, (v, c)
                    assert (c.host, c.port) == ("127.0.0.1", proxy.broker_port(c.node_id))
            else:
                assert response.error_code == 0, (v, response)
                assert (response.host, response.port) == (
                    "127.0.0.1",
                    proxy.broker_port(response.node_id),
                )
            assert f"port={tansu.port}" not in str(response)


def test_describe_cluster_every_version_has_proxy_addresses(
    proxy: ProxyProcess, tansu: TansuBroker, offered: dict[int, tuple[int, int]]
) -> None:
    if 60 not in offered:
        pytest.skip("broker does not offer DescribeCluster")
    with KafkaWire("127.0.0.1", proxy.bootstrap_port) as wire:
        for v in _versions(offered, 60):
            response = wire.request(
                60,
                v,
                include_cluster_authorized_operations=False,
                endpoint_type=1,
                include_fenced_brokers=False,
            )
            assert response.brokers
            for b in response.brokers:
                assert (b.host, b.port) == ("127.0.0.1", proxy.broker_port(b.broker_id)), v


def test_pipelined_requests_keep_order(proxy: ProxyProcess) -> None:
    """Many requests in flight on one connection come back in order, each rewritten."""
    with KafkaWire("127.0.0.1", proxy.bootstrap_port) as wire:
        frames = [
            wire.encode(
                3,
                12,
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            for _ in range(50)
        ]
        wire.send_raw(b"".join(frames))
        from kafka_quota_proxy.protocol.headers import parse_response_header
        from kafka_quota_proxy.protocol.rewrite import decode_response

        for i in range(50):
            size = int.from_bytes(wire.recv_exactly(4), "big")
            frame = wire.recv_exactly(size)
            header = parse_response_header(frame, 0, size, 1)
            assert header.correlation_id == i + 1
            response = decode_response(3, 12, frame[header.size :])
            assert all(b.port == proxy.broker_port(b.node_id) for b in response.brokers)
