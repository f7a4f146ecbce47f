"""Rewriting of the responses that carry broker addresses (and of ApiVersions).

Clients must never learn an upstream broker's address. Every response that carries one is
rewritten so that each broker (node id) appears at the proxy's own address for it; the
``AddressMap`` the proxy supplies decides that address (and may open a listener for a broker
it has not seen before). Everything else in the response is preserved.

- Metadata, FindCoordinator (single and batched forms) and DescribeCluster are decoded and
  encoded with kio.
- Produce (v10+) and Fetch (v16+) responses are skimmed (``skim.py``): only when their top-level
  tagged fields carry ``node_endpoints`` is that one field decoded with kio, rewritten and
  spliced back; the record batches are never decoded.
- ShareFetch/ShareAcknowledge (KIP-932) are decoded with kio (rare, small).
- ApiVersions: only the leading ``api_keys`` array is edited (versions capped, unknown APIs
  hidden; see ``apis.offered_range``). Its layout is the same in every version, so the edit
  also works for ApiVersions versions kio does not know and preserves any tagged fields.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Protocol

from kio.index import load_entity_module, load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.constants import EntityType

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.apis import ApiKey
from kafka_quota_proxy.protocol.correlation import InFlight
from kafka_quota_proxy.protocol.errors import MalformedFrame
from kafka_quota_proxy.protocol.fetch import set_preferred_read_replicas
from kafka_quota_proxy.protocol.headers import parse_response_header
from kafka_quota_proxy.protocol.primitives import (
    INT16,
    INT32,
    encode_tagged_fields,
    read_tagged_fields,
    read_uvarint,
    skip_tagged_fields,
    write_uvarint,
)
from kafka_quota_proxy.protocol.skim import fetch_response_layout, produce_response_layout


class AddressMap(Protocol):
    def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> tuple[str, int]:
        """Return the (host, port) clients must use for this upstream broker."""
        ...


class UndecodableResponse(MalformedFrame):
    reason = "undecodable_response"


@cache
def _response_class(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


@cache
def _nested_class(api_key: int, version: int, name: str) -> Any:
    module = load_entity_module(api_key_map[api_key], version, EntityType.response)
    return getattr(module, name)


def decode_response(api_key: int, version: int, body: bytes | memoryview) -> Any:
    cls = _response_class(api_key, version)
    try:
        value, size = entity_reader(cls)(body, 0)
    except Exception as exc:  # kio raises KeyError, ValueError, DecodeError, ...
        raise UndecodableResponse(
            f"{apis.api_name(api_key)} v{version} response does not decode: {exc!r}"
        ) from None
    if size != len(body):
        raise UndecodableResponse(
            f"{apis.api_name(api_key)} v{version} response has {len(body) - size} trailing bytes"
        )
    return value


def encode_entity(value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return buf.getvalue()


def _with_address(entity: Any, addresses: AddressMap) -> Any:
    # DescribeCluster names it broker_id; everything else node_id.
    node_id = entity.node_id if hasattr(entity, "node_id") else entity.broker_id
    if node_id < 0:
        return entity  # e.g. FindCoordinator error: node_id -1, host ""
    rack = getattr(entity, "rack", None)
    host, port = addresses.advertise(node_id, entity.host, entity.port, rack)
    if host == entity.host and port == entity.port:
        return entity
    return dataclasses.replace(entity, host=host, port=type(entity.port)(port))


def _rewrite_list(value: Any, field: str, addresses: AddressMap) -> Any:
    items = getattr(value, field)
    new = tuple(_with_address(item, addresses) for item in items)
    if all(a is b for a, b in zip(new, items, strict=True)):
        return value
    return dataclasses.replace(value, **{field: new})


def _rewrite_metadata(value: Any, addresses: AddressMap) -> Any:
    return _rewrite_list(value, "brokers", addresses)


def _rewrite_find_coordinator(value: Any, addresses: AddressMap) -> Any:
    if hasattr(value, "coordinators"):  # v4+: batched form
        return _rewrite_list(value, "coordinators", addresses)
    if value.error_code != 0:
        return value
    return _with_address(value, addresses)


def _rewrite_node_endpoints(value: Any, addresses: AddressMap) -> Any:
    return _rewrite_list(value, "node_endpoints", addresses)


_DECODED: dict[int, Callable[[Any, AddressMap], Any]] = {
    ApiKey.METADATA: _rewrite_metadata,
    ApiKey.DESCRIBE_CLUSTER: _rewrite_metadata,
    ApiKey.FIND_COORDINATOR: _rewrite_find_coordinator,
    ApiKey.SHARE_FETCH: _rewrite_node_endpoints,
    ApiKey.SHARE_ACKNOWLEDGE: _rewrite_node_endpoints,
}

_NODE_ENDPOINTS_TAG = 0


def _rewrite_node_endpoints_field(
    api_key: int, version: int, fields: list[tuple[int, bytes]], addresses: AddressMap
) -> list[tuple[int, bytes]] | None:
    """Rewrite the KIP-951 ``node_endpoints`` field (tag 0) among top-level tagged fields;
    ``None`` when nothing changed."""
    node_cls = _nested_class(api_key, version, "NodeEndpoint")
    read_node = entity_reader(node_cls)
    write_node = entity_writer(node_cls)
    new_fields: list[tuple[int, bytes]] = []
    changed = False
    for tag, payload in fields:
        if tag == _NODE_ENDPOINTS_TAG:
            count, pos = read_uvarint(payload, 0)
            out = io.BytesIO()
            out.write(write_uvarint(count))
            for _ in range(max(count - 1, 0)):
                node, size = read_node(payload, pos)
                pos += size
                new = _with_address(node, addresses)
                changed = changed or new is not node
                write_node(out, new)
            payload = out.getvalue()
        new_fields.append((tag, payload))
    return new_fields if changed else None


def rewrite_node_endpoints_tag(
    api_key: int, version: int, body: bytes, tags_offset: int, addresses: AddressMap
) -> bytes | None:
    """Rewrite the KIP-951 ``node_endpoints`` tagged field of a Produce/Fetch response body."""
    fields, end = read_tagged_fields(body, tags_offset)
    new_fields = _rewrite_node_endpoints_field(
        api_key, version, [(t, body[a:b]) for t, a, b in fields], addresses
    )
    if new_fields is None:
        return None
    return body[:tags_offset] + encode_tagged_fields(new_fields) + body[end:]


def _padded_uvarint(value: int, width: int) -> bytes:
    """``value`` as an unsigned varint of exactly ``width`` bytes (redundant continuation bytes
    are valid: Kafka's readers accept them)."""
    out = bytearray()
    for _ in range(width - 1):
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    if value >= 0x80:
        raise ValueError("value does not fit")
    out.append(value)
    return bytes(out)


def _filler_field(length: int, tag: int) -> bytes | None:
    """A tagged field of exactly ``length`` bytes with an unknown tag and a zero payload."""
    for width in range(1, 6):
        payload = length - 1 - width
        if payload < 0:
            return None
        if payload < 1 << (7 * width):
            return write_uvarint(tag) + _padded_uvarint(payload, width) + bytes(payload)
    return None


def fit_tagged_fields(fields: list[tuple[int, bytes]], length: int) -> bytes | None:
    """Encode tagged fields in exactly ``length`` bytes, padding where needed with one extra
    field whose tag no client of these versions knows (clients skip unknown tags), or with a
    redundant varint byte; ``None`` if they do not fit."""
    fields = sorted(fields)
    body = b"".join(write_uvarint(t) + write_uvarint(len(p)) + p for t, p in fields)
    count = len(fields)
    short = length - len(write_uvarint(count)) - len(body)
    if short == 0:
        return write_uvarint(count) + body
    if short < 0:
        return None
    if short == 1 and count < 0x80:
        return _padded_uvarint(count, 2) + body
    filler_tag = fields[-1][0] + 1 if fields else 1
    count_bytes = write_uvarint(count + 1)
    filler = _filler_field(length - len(count_bytes) - len(body), filler_tag)
    return None if filler is None else count_bytes + body + filler


def cap_api_versions(
    body: bytes,
    version: int,
    offered: Callable[[int, int, int], tuple[int, int] | None] = apis.offered_range,
    answered: Mapping[int, tuple[int, int]] = apis.ANSWERED_BY_PROXY,
) -> bytes:
    """Edit an ApiVersions response body's ``api_keys`` array (see module docstring):
    ``offered(api_key, min, max)`` gives the range to advertise, or None to drop the API; the
    APIs the proxy answers itself (``answered``: by default ``apis.ANSWERED_BY_PROXY``) are
    advertised at its range, whatever the broker offers (after the broker's entries)."""
    flexible = version >= 3
    pos = 2  # error_code
    if flexible:
        count, pos = read_uvarint(body, pos)
        count -= 1
    else:
        count = INT32.unpack_from(body, pos)[0]
        pos += 4
    kept: list[tuple[int, bytes]] = []
    for _ in range(max(count, 0)):
        start = pos
        api_key = INT16.unpack_from(body, pos)[0]
        lo = INT16.unpack_from(body, pos + 2)[0]
        hi = INT16.unpack_from(body, pos + 4)[0]
        pos += 6
        tag_start = pos
        if flexible:
            pos = skip_tagged_fields(body, pos)
        if api_key in answered:
            continue  # (added below, at the proxy's range)
        kept_range = offered(api_key, lo, hi)
        if kept_range is None:
            continue
        if kept_range == (lo, hi):
            kept.append((api_key, body[start:pos]))
        else:
            kept.append((api_key,
                         INT16.pack(api_key)
                         + INT16.pack(kept_range[0])
                         + INT16.pack(kept_range[1])
                         + body[tag_start:pos]))
    if pos > len(body):
        raise IndexError("api versions response truncated")
    for api_key, (lo, hi) in answered.items():
        kept.append((api_key, INT16.pack(api_key) + INT16.pack(lo) + INT16.pack(hi)
                     + (b"\x00" if flexible else b"")))
    length = write_uvarint(len(kept) + 1) if flexible else INT32.pack(len(kept))
    return body[:2] + length + b"".join(b for _, b in kept) + body[pos:]


@cache
def throttle_field(api_key: int, version: int) -> str | None:
    """Where a response carries ``throttle_time_ms``: ``"first"`` (the first body field, as in
    almost every API), ``"produce"`` (after the responses array), or ``None`` (no such field,
    or not where the proxy sets it)."""
    if api_key == ApiKey.API_VERSIONS:
        return None
    try:
        cls = _response_class(api_key, version)
    except Exception:  # a version kio does not know: leave the frame alone
        return None
    names = [f.name for f in dataclasses.fields(cls)]
    if "throttle_time" not in names:
        return None
    if names[0] == "throttle_time":
        return "first"
    return "produce" if api_key == ApiKey.PRODUCE else None


def set_throttle_time(entry: InFlight, frame: bytes) -> bytes | None:
    """``frame`` (a whole response without size prefix) with ``throttle_time_ms`` raised to
    ``entry.throttle_ms`` (a larger value set by the broker is kept); ``None`` if the response
    has no such field."""
    kind = throttle_field(entry.api_key, entry.api_version)
    if kind is None:
        return None
    try:
        header = parse_response_header(
            frame, 0, len(frame), apis.response_header_version(entry.api_key, entry.api_version)
        )
        if kind == "first":
            offset = header.size
        else:
            offset = produce_response_layout(frame, header.size, entry.api_version).throttle_offset
        current = INT32.unpack_from(frame, offset)[0]
    except (IndexError, ValueError, struct.error) as exc:
        raise UndecodableResponse(
            f"{apis.api_name(entry.api_key)} v{entry.api_version}: throttle_time_ms not found: "
            f"{exc!r}"
        ) from None
    if current >= entry.throttle_ms:
        return frame
    return frame[:offset] + INT32.pack(entry.throttle_ms) + frame[offset + 4 :]


class ResponseRewriter:
    """The ``Rewriter`` the response stream calls for each address-bearing response frame, and
    the ``TailRewriter`` for the top-level tagged fields of streamed Fetch responses."""

    def __init__(self, addresses: AddressMap) -> None:
        self.addresses = addresses
        # node_endpoints that could not be rewritten in the same number of bytes and were
        # dropped instead (clients then refresh metadata, which is rewritten as usual)
        self.node_endpoints_dropped = 0
        self.rewritten: dict[int, int] = {}  # api key -> responses changed
        # sees every decoded MetadataResponse (the cluster topology for fetch routing)
        self.on_metadata: Callable[[Any], None] | None = None
        # (entry, decoded MetadataResponse) -> the MetadataResponse clients get (the topic
        # guard leaves the proxy's topics out)
        self.metadata_filter: Callable[[InFlight, Any], Any] | None = None
        # (entry, frame) -> the response with what a filter took out of the request
        # (``entry.refused``) answered (the topic guard); called first, for those entries
        self.amend: Callable[[InFlight, bytes | memoryview], bytes | None] | None = None
        # the APIs this listener's proxy answers itself and their versions, advertised in
        # ApiVersions whatever the broker offers (features add theirs: the ACL admin APIs)
        self.answered: dict[int, tuple[int, int]] = dict(apis.ANSWERED_BY_PROXY)

    def rewrite_tail(self, entry: InFlight, tail: bytes) -> bytes:
        """Rewrite the top-level tagged fields ``tail`` of a streamed response into exactly
        ``len(tail)`` bytes."""
        try:
            fields, end = read_tagged_fields(tail, 0)
            if end != len(tail):
                raise UndecodableResponse(
                    f"{apis.api_name(entry.api_key)} v{entry.api_version} response has "
                    f"{len(tail) - end} bytes after its tagged fields"
                )
            if not any(tag == _NODE_ENDPOINTS_TAG for tag, _, _ in fields):
                return tail
            pairs = [(t, tail[a:b]) for t, a, b in fields]
            new_fields = _rewrite_node_endpoints_field(
                entry.api_key, entry.api_version, pairs, self.addresses
            )
        except UndecodableResponse:
            raise
        except (IndexError, ValueError, KeyError, struct.error, SerialError) as exc:
            raise UndecodableResponse(
                f"{apis.api_name(entry.api_key)} v{entry.api_version} tagged fields do not "
                f"parse: {exc!r}"
            ) from None
        if new_fields is None:
            return tail
        fitted = fit_tagged_fields(new_fields, len(tail))
        if fitted is None:
            self.node_endpoints_dropped += 1
            kept = [(t, p) for t, p in new_fields if t != _NODE_ENDPOINTS_TAG]
            fitted = fit_tagged_fields(kept, len(tail))
        if fitted is None:
            raise UndecodableResponse("cannot rewrite node_endpoints in place")
        self._count(entry.api_key)
        return fitted

    def _count(self, api_key: int) -> None:
        self.rewritten[api_key] = self.rewritten.get(api_key, 0) + 1

    def __call__(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        answer = entry.answer
        if answer is not None:  # the proxy's answer (a local one, or one replacing the broker's)
            if entry.throttle_ms > 0:
                answer = set_throttle_time(entry, answer) or answer
            entry.response_size = len(answer) + 4  # what the client gets
            return answer
        new = None
        if entry.refused is not None and self.amend is not None:
            new = self.amend(entry, frame)
            if new is not None:
                frame = new
                entry.response_size = len(new) + 4  # what the client gets
        if apis.needs_response_rewrite(entry.api_key, entry.api_version):
            rewritten = self._rewrite(entry, frame)
            if rewritten is not None:
                new = rewritten
                self._count(entry.api_key)
        if entry.route is not None:
            routed = self._route(entry, new if new is not None else frame)
            if routed is not None:
                new = routed
        if entry.throttle_ms > 0:
            patched = set_throttle_time(entry, new if new is not None else bytes(frame))
            if patched is not None:
                new = patched
        return new

    def _route(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        """Set ``preferred_read_replica`` where ``entry.route`` picks a replica."""
        route = entry.route
        assert route is not None
        try:
            header = parse_response_header(
                frame, 0, len(frame), apis.response_header_version(entry.api_key,
                                                                   entry.api_version))
            new, _ = set_preferred_read_replicas(frame, header.size, entry.api_version, route)
        except (IndexError, ValueError, struct.error) as exc:
            raise UndecodableResponse(
                f"Fetch v{entry.api_version} response does not parse: {exc!r}") from None
        if new is not None:
            entry.response_size = len(new) + 4  # what the client gets
        return new

    def _rewrite(self, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        api_key = entry.api_key
        version = entry.api_version
        try:
            header = parse_response_header(
                frame, 0, len(frame), apis.response_header_version(api_key, version)
            )
            if api_key == ApiKey.PRODUCE or api_key == ApiKey.FETCH:
                # Hot path: walk by lengths; copy and decode only if node_endpoints is there.
                skim = (
                    produce_response_layout if api_key == ApiKey.PRODUCE else fetch_response_layout
                )
                layout = skim(frame, header.size, version)
                if frame[layout.tags_offset] == 0:  # no top-level tagged fields
                    return None
                return rewrite_node_endpoints_tag(
                    api_key, version, bytes(frame), layout.tags_offset, self.addresses
                )
            frame = bytes(frame)
            head, body = frame[: header.size], frame[header.size :]
            if api_key == ApiKey.API_VERSIONS:
                # A broker that does not support the requested version answers with v0.
                error_code = INT16.unpack_from(body, 0)[0]
                return head + cap_api_versions(body, 0 if error_code == 35 else version,
                                               answered=self.answered)
            value = decode_response(api_key, version, body)
            decoded = value
            if api_key == ApiKey.METADATA:
                if self.on_metadata is not None:
                    self.on_metadata(value)
                if self.metadata_filter is not None:
                    value = self.metadata_filter(entry, value)
            new_value = _DECODED[api_key](value, self.addresses)
            if new_value is decoded:
                return None
            return head + encode_entity(new_value)
        except UndecodableResponse:
            raise
        except (IndexError, ValueError, KeyError, struct.error, SerialError) as exc:
            raise UndecodableResponse(
                f"{apis.api_name(api_key)} v{version} response does not parse: {exc!r}"
            ) from None
