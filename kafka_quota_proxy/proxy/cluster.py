"""The proxy's own view of the cluster: it asks a broker for ApiVersions and Metadata (no
topics) to learn every broker before any client does, and refreshes that list periodically.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import secrets
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_writer

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.headers import encode_request_header, parse_response_header
from kafka_quota_proxy.protocol.primitives import INT16, INT32
from kafka_quota_proxy.protocol.rewrite import decode_response
from kafka_quota_proxy.protocol.sasl_frames import SASL_AUTHENTICATE, SASL_HANDSHAKE
from kafka_quota_proxy.security.scram import ScramClient

CLIENT_ID = "kafka-quota-proxy"


@dataclasses.dataclass(frozen=True, slots=True)
class OwnIdentity:
    """The proxy's own SASL identity toward the brokers (``upstream.sasl``)."""

    mechanism: str
    username: str
    password: str


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None


def _encode_request(api_key: int, version: int, correlation_id: int, **fields: Any) -> bytes:
    cls = load_request_schema(api_key, version)
    names = {f.name for f in dataclasses.fields(cls)}
    body = io.BytesIO()
    entity_writer(cls)(body, cls(**{k: v for k, v in fields.items() if k in names}))
    frame = encode_request_header(api_key, version, correlation_id, CLIENT_ID) + body.getvalue()
    return INT32.pack(len(frame)) + frame


async def _roundtrip(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    api_key: int,
    version: int,
    correlation_id: int,
    **fields: Any,
) -> bytes:
    writer.write(_encode_request(api_key, version, correlation_id, **fields))
    await writer.drain()
    size = INT32.unpack(await reader.readexactly(4))[0]
    frame = await reader.readexactly(size)
    header = parse_response_header(frame, 0, size, apis.response_header_version(api_key, version))
    if header.correlation_id != correlation_id:
        raise ConnectionError("unexpected correlation id from broker")
    return frame[header.size :]


def _max_version(body: bytes, api_key: int) -> int:
    """Highest version of ``api_key`` a v0 ApiVersions response body offers (-1: none)."""
    count = INT32.unpack_from(body, 2)[0]
    for i in range(count):
        off = 6 + 6 * i
        if INT16.unpack_from(body, off)[0] == api_key:
            return int(INT16.unpack_from(body, off + 4)[0])
    return -1


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       identity: OwnIdentity) -> None:
    """SASL (KIP-152: SaslHandshake v1, SaslAuthenticate v1) as the proxy itself."""
    body = await _roundtrip(reader, writer, SASL_HANDSHAKE, 1, 101, mechanism=identity.mechanism)
    if INT16.unpack_from(body, 0)[0] != 0:
        raise ConnectionError(f"the broker refuses SASL mechanism {identity.mechanism}")

    async def send(token: bytes, correlation_id: int) -> bytes:
        body = await _roundtrip(reader, writer, SASL_AUTHENTICATE, 1, correlation_id,
                                auth_bytes=token)
        result = decode_response(SASL_AUTHENTICATE, 1, body)
        if int(result.error_code):
            raise ConnectionError(f"SASL authentication as {identity.username} failed: "
                                  f"{result.error_message}")
        return bytes(result.auth_bytes)

    if identity.mechanism == "PLAIN":
        await send(b"\0" + identity.username.encode() + b"\0" + identity.password.encode(), 102)
        return
    scram = ScramClient(identity.mechanism, identity.username, identity.password,
                        secrets.token_urlsafe(18))
    server_first = await send(scram.first(), 102)
    scram.verify(await send(scram.final(server_first), 103))


async def fetch_brokers(host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None,
                        identity: OwnIdentity | None = None, topics: Sequence[str] | None = (),
                        seen: Callable[[str, Any], None] | None = None) -> list[BrokerInfo]:
    """Ask one broker for the cluster's brokers; with ``topics`` (Metadata v4+, which never
    creates them), also for those topics, or for every topic (None): ``seen(name,
    topic_id)`` for each one it has (the topic guard learns the ids of the proxy's own
    topics, the ACLs those of every topic)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=tls,
                                server_hostname=host if tls is not None else None), timeout)
    try:
        async with asyncio.timeout(timeout):
            if identity is not None:
                await authenticate(reader, writer, identity)
            versions = await _roundtrip(reader, writer, ApiKey.API_VERSIONS, 0, 1)
            if INT16.unpack_from(versions, 0)[0] != 0:
                raise ConnectionError("ApiVersions failed")
            version = min(
                _max_version(versions, ApiKey.METADATA), apis.kio_version_range(ApiKey.METADATA)[1]
            )
            if version < 1:
                raise ConnectionError("broker offers no usable Metadata version")
            asked: tuple[Any, ...] | None = ()
            if topics is None:
                asked = None  # every topic
            elif topics and version >= 4:
                module = __import__(load_request_schema(ApiKey.METADATA, version).__module__,
                                    fromlist=["MetadataRequestTopic"])
                extra = {"topic_id": None} if version >= 10 else {}
                asked = tuple(module.MetadataRequestTopic(name=t, **extra) for t in topics)
            body = await _roundtrip(
                reader,
                writer,
                ApiKey.METADATA,
                version,
                2,
                topics=asked,
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
            response = decode_response(ApiKey.METADATA, version, body)
    finally:
        writer.close()
    if (asked is None or asked) and seen is not None:
        for t in response.topics:
            if t.name is not None and not t.error_code:
                seen(str(t.name), getattr(t, "topic_id", None))
    return [
        BrokerInfo(b.node_id, b.host, b.port, getattr(b, "rack", None)) for b in response.brokers
    ]
