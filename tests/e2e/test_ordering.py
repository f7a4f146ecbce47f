"""Requests written while the proxy is still connecting to the broker reach it in the order the
client wrote them, and so are answered in that order (Kafka answers a connection's requests in
order, and clients rely on it): a client that pipelines from its first byte, in many small
writes, gets every answer in order."""

from __future__ import annotations

import asyncio
import struct

import pytest

from kafka_quota_proxy.protocol.headers import encode_request_header
from testkit.e2e import ProxyProcess

pytestmark = pytest.mark.e2e

CONNECTIONS = 300
REQUESTS = 40


def _api_versions_v0(correlation: int) -> bytes:
    frame = encode_request_header(18, 0, correlation, "ordering")  # ApiVersions v0: no body
    return struct.pack(">i", len(frame)) + frame


async def _one(port: int, first: int) -> list[int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(REQUESTS):  # one write each, spread over the connect
            writer.write(_api_versions_v0(first + i))
            await asyncio.sleep(0)
            if i % 4 == 0:
                await asyncio.sleep(0.0005)
        got = []
        for _ in range(REQUESTS):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            got.append(struct.unpack(">i", (await reader.readexactly(size))[:4])[0])
        return got
    finally:
        writer.close()


def test_requests_pipelined_from_the_first_byte_are_answered_in_order(
        proxy: ProxyProcess) -> None:
    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(
            _one(proxy.bootstrap_port, 1000 * c) for c in range(CONNECTIONS))))

    answers = asyncio.run(main())
    wrong = [c for c, got in enumerate(answers)
             if got != list(range(1000 * c, 1000 * c + REQUESTS))]
    assert not wrong, f"{len(wrong)} of {CONNECTIONS} connections answered out of order"
