"""Bad input closes only the offending connection, with a logged and counted reason; other
clients keep working."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.admin import AdminClient

from kafka_quota_proxy.protocol.headers import encode_request_header
from testkit.e2e import KafkaWire, ProxyProcess, wait_for

pytestmark = pytest.mark.e2e


def _metadata_ok(wire: KafkaWire, proxy: ProxyProcess) -> None:
    response = wire.request(
        3,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert [b.port for b in response.brokers] == [proxy.broker_port(111)]


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


CASES = {
    "negative_size": (struct.pack(">i", -5) + b"xxxx", "negative_frame_size"),
    "oversized_size": (struct.pack(">i", 200 * 1024 * 1024), "frame_too_large"),
    "garbage": (b"\x47\x45\x54 / HTTP/1.1\r\nHost: x\r\n\r\n", "frame_too_large"),
    "garbage_small_size": (_frame(b"\xff" * 3), "malformed_frame"),
    "unknown_api_key": (
        _frame(encode_request_header(9999, 0, 1, "bad") + b"\x00" * 8),
        "unknown_api_key",
    ),
    "inter_broker_api_key": (_frame(encode_request_header(4, 0, 1, "bad")), "unknown_api_key"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("listener", ["bootstrap", "broker"])
def test_bad_frame_closes_only_its_connection(
    proxy: ProxyProcess, case: str, listener: str
) -> None:
    data, reason = CASES[case]
    port = proxy.bootstrap_port if listener == "bootstrap" else proxy.broker_port(111)
    before = proxy.metrics().get(f'kafka_proxy_connections_closed_total{{reason="{reason}"}}', 0)
    with KafkaWire("127.0.0.1", port) as good, KafkaWire("127.0.0.1", port) as bad:
        _metadata_ok(good, proxy)
        bad.send_raw(data)
        assert bad.is_closed_by_peer(10), "the bad connection stayed open"
        _metadata_ok(good, proxy)  # the other connection carries on
    wait_for(
        lambda: any(
            e["reason"] == reason and e.get("offender") == "client"
            for e in proxy.closed_connections()
        ),
        10,
        what=f"logged {reason}",
    )
    after = proxy.metrics()[f'kafka_proxy_connections_closed_total{{reason="{reason}"}}']
    assert after >= before + 1
    assert proxy.alive


def test_truncated_frame_is_logged(proxy: ProxyProcess) -> None:
    frame = _frame(encode_request_header(3, 12, 7, "trunc") + b"\x01\x00\x00")
    with KafkaWire("127.0.0.1", proxy.bootstrap_port) as good:
        bad = KafkaWire("127.0.0.1", proxy.bootstrap_port)
        bad.send_raw(frame[: len(frame) - 2])
        bad.sock.shutdown(1)  # half-close: the proxy sees EOF in the middle of the frame
        assert bad.is_closed_by_peer(10)
        bad.close()
        _metadata_ok(good, proxy)
    wait_for(
        lambda: any(e["reason"] == "truncated_frame" for e in proxy.closed_connections()),
        10,
        what="logged truncated_frame",
    )


def test_real_client_unaffected_by_bad_neighbours(proxy: ProxyProcess) -> None:
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    assert admin.list_topics(timeout=10).brokers
    for data, _reason in CASES.values():
        with KafkaWire("127.0.0.1", proxy.bootstrap_port) as bad:
            bad.send_raw(data)
            assert bad.is_closed_by_peer(10)
    md = admin.list_topics(timeout=10)
    assert [b.port for b in md.brokers.values()] == [proxy.broker_port(111)]
