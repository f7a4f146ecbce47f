"""Frame builders, kio helpers and hypothesis strategies for the protocol tests.

Plain functions and strategies, no fixtures, so they work inside ``@given`` tests.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import itertools
import struct
import types
import typing
import uuid
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any

from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import (
    Interval,
    Records,
    TZAware,
    f64,
    i32Timedelta,
    i64Timedelta,
)

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.headers import encode_request_header, encode_response_header

INT32 = struct.Struct(">i")

PROXY_HOST = "proxy.example"
PROXY_PORT_BASE = 20000


# --------------------------------------------------------------------------- framing


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its 4-byte big-endian size."""
    return INT32.pack(len(payload)) + payload


def request_frame(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None = "client",
    body: bytes = b"",
    tagged_fields: list[tuple[int, bytes]] | None = None,
) -> bytes:
    header = encode_request_header(api_key, api_version, correlation_id, client_id, tagged_fields)
    return frame(header + body)


def response_frame(api_key: int, api_version: int, correlation_id: int, body: bytes) -> bytes:
    header = encode_response_header(
        correlation_id, apis.response_header_version(api_key, api_version)
    )
    return frame(header + body)


def produce_body_prefix(api_version: int, acks: int, transactional_id: str | None) -> bytes:
    """The start of a Produce request body: [transactional_id] acks timeout_ms."""
    out = b""
    if api_version >= 3:
        if api_version >= 9:
            if transactional_id is None:
                out += b"\x00"
            else:
                raw = transactional_id.encode()
                out += _uvarint(len(raw) + 1) + raw
        elif transactional_id is None:
            out += struct.pack(">h", -1)
        else:
            raw = transactional_id.encode()
            out += struct.pack(">h", len(raw)) + raw
    return out + struct.pack(">h", acks) + struct.pack(">i", 30000)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def split(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """Split ``data`` at the given cut points (clamped, sorted, deduplicated)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [b""]


def chunked(data: bytes, draw: Callable[[st.SearchStrategy[Any]], Any]) -> list[bytes]:
    """Draw random cut points for ``data`` (including single-byte chunks sometimes)."""
    if draw(st.booleans()) and len(data) < 300:
        cuts = list(range(len(data)))  # byte by byte
    else:
        cuts = draw(st.lists(st.integers(min_value=0, max_value=max(len(data), 0)), max_size=12))
    return split(data, cuts)


# Text that can be encoded as UTF-8 (no lone surrogates).
def texts(max_size: int = 12, min_size: int = 0) -> st.SearchStrategy[str]:
    return st.text(st.characters(codec="utf-8"), min_size=min_size, max_size=max_size)


def tagged_fields_strategy(max_fields: int = 3) -> st.SearchStrategy[list[tuple[int, bytes]]]:
    return st.lists(
        st.tuples(st.integers(min_value=0, max_value=300), st.binary(max_size=8)),
        max_size=max_fields,
        unique_by=lambda f: f[0],
    )


# --------------------------------------------------------------------------- kio


def kio_encode(value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return buf.getvalue()


def kio_decode(cls: type, data: bytes) -> Any:
    value, size = entity_reader(cls)(data, 0)
    assert size == len(data), f"{cls.__name__}: {len(data) - size} trailing bytes"
    return value


@cache
def response_class(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


def nested_class(api_key: int, version: int, name: str) -> Any:
    module = __import__(response_class(api_key, version).__module__, fromlist=[name])
    return getattr(module, name)


def ms(value: int) -> datetime.timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


_MAX_ITEMS = 3

# Field-name overrides: node ids stay small so 20000+N is a valid port, and -1 shows up.
_FIELD_OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    "node_id": st.integers(min_value=-1, max_value=50),
    "broker_id": st.integers(min_value=-1, max_value=50),
}


def _strategy_for(tp: Any, max_items: int) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(args) == 1, tp
        return st.none() | _strategy_for(args[0], max_items)
    if origin is tuple:
        (item, _ellipsis) = typing.get_args(tp)
        return st.lists(_strategy_for(item, max_items), max_size=max_items).map(tuple)
    if dataclasses.is_dataclass(tp):
        return kio_values(tp, max_items)
    if tp is bool:
        return st.booleans()
    if tp is ErrorCode:
        return st.sampled_from(list(ErrorCode))
    if tp is i32Timedelta:
        return st.integers(min_value=-(2**31), max_value=2**31 - 1).map(ms)
    if tp is i64Timedelta:
        return st.integers(min_value=0, max_value=2**40).map(
            lambda x: i64Timedelta.parse(datetime.timedelta(milliseconds=x))
        )
    if tp is TZAware:
        return st.integers(min_value=0, max_value=2**33).map(
            lambda s: TZAware.parse(datetime.datetime.fromtimestamp(s, tz=datetime.UTC))
        )
    if tp is f64:
        return st.floats(allow_nan=False, allow_infinity=False).map(f64)
    if tp is Records or tp is bytes:
        return st.binary(max_size=24)
    if tp is uuid.UUID:
        return st.uuids()
    if isinstance(tp, type) and issubclass(tp, str):
        return texts()
    if isinstance(tp, type) and issubclass(tp, Interval):
        return st.integers(min_value=tp.__low__, max_value=tp.__high__)
    raise NotImplementedError(f"no strategy for {tp!r}")


@cache
def kio_values(cls: type, max_items: int = _MAX_ITEMS) -> st.SearchStrategy[Any]:
    """A strategy for instances of a kio dataclass, with short arrays and strings."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        override = _FIELD_OVERRIDES.get(f.name)
        if override is None:
            override = _strategy_for(hints[f.name], max_items)
        kwargs[f.name] = override
    return st.builds(cls, **kwargs)


def _minimal_for(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return None
    if origin is tuple:
        return ()
    if dataclasses.is_dataclass(tp):
        return minimal(tp)
    if tp is bool:
        return False
    if tp is ErrorCode:
        return ErrorCode(0)
    if tp is i32Timedelta:
        return ms(0)
    if tp is i64Timedelta:
        return i64Timedelta.parse(datetime.timedelta(0))
    if tp is TZAware:
        return TZAware.parse(datetime.datetime.fromtimestamp(0, tz=datetime.UTC))
    if tp is Records or tp is bytes:
        return b""
    if tp is uuid.UUID:
        return uuid.UUID(int=0)
    if isinstance(tp, type) and issubclass(tp, str):
        return ""
    if isinstance(tp, type) and issubclass(tp, Interval):
        return 0
    raise NotImplementedError(f"no minimal value for {tp!r}")


def minimal(cls: type) -> Any:
    """The smallest instance of a kio dataclass: defaults, empty arrays, nulls, zeros."""
    hints = typing.get_type_hints(cls)
    kwargs = {
        f.name: _minimal_for(hints[f.name])
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return cls(**kwargs)


# --------------------------------------------------------------------------- addresses


class RecordingAddressMap:
    """AddressMap that maps node N to (PROXY_HOST, PROXY_PORT_BASE + N) and records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, int, str | None]] = []

    def advertise(self, node_id: int, host: str, port: int, rack: str | None) -> tuple[str, int]:
        self.calls.append((node_id, host, port, rack))
        return PROXY_HOST, PROXY_PORT_BASE + node_id


def proxied(entity: Any, id_field: str = "node_id") -> Any:
    """``entity`` as the rewriter should leave it: proxy address for node ids >= 0."""
    node_id = getattr(entity, id_field)
    if node_id < 0:
        return entity
    return dataclasses.replace(entity, host=PROXY_HOST, port=PROXY_PORT_BASE + node_id)


def kio_request(api_key: int, version: int, correlation_id: int, client_id: str = "client-1",
                **fields: Any) -> bytes:
    """A request as filters see it (header and body, no size prefix): kio's class for
    ``(api_key, version)`` built from ``fields`` (those it has; the rest left out)."""
    from kio.index import load_request_schema

    cls = load_request_schema(api_key, version)
    names = {f.name for f in dataclasses.fields(cls)}
    body = kio_encode(cls(**{k: v for k, v in fields.items() if k in names}))
    return request_frame(api_key, version, correlation_id, client_id, body)[4:]


def sasl_plain(user: str, password: str = "secret") -> bytes:
    """SASL PLAIN's message: authzid (empty), authcid and password."""
    return f"\x00{user}\x00{password}".encode()


def create_topics_request(topics: list[tuple[str, int]], version: int = 7,
                          validate_only: bool = False) -> bytes:
    """A CreateTopics request (no size prefix; correlation id 7, client-id ``admin``) for
    ``[(name, partitions)]``, replication factor 1."""
    from kio.index import load_request_schema

    mod = __import__(load_request_schema(19, version).__module__, fromlist=["_"])
    return kio_request(19, version, 7, "admin", topics=tuple(
        mod.CreatableTopic(name=n, num_partitions=p, replication_factor=1, assignments=(),
                           configs=()) for n, p in topics),
        timeout=datetime.timedelta(seconds=5), validate_only=validate_only)


def damaged_tagged_sections(draw: Callable[[st.SearchStrategy[Any]], Any]) -> bytes:
    """Three tagged-field sections as they may follow a frame's last records: well-formed,
    or cut, a byte or two short, padded, random, or with a varint too long."""
    from kafka_quota_proxy.protocol.primitives import write_uvarint

    out = b""
    for _ in range(3):
        fields = draw(st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=40)),
                               max_size=2))
        out += write_uvarint(len(fields)) + b"".join(
            write_uvarint(tag) + write_uvarint(len(value)) + value for tag, value in fields)
    damage = draw(st.sampled_from(["none", "cut", "short", "pad", "random", "long varint"]))
    if damage == "cut":
        out = out[:draw(st.integers(0, len(out)))]
    elif damage == "short":  # (the last section's last value a byte or two short)
        out = out[:len(out) - draw(st.integers(1, 2))]
    elif damage == "pad":
        out += draw(st.binary(min_size=1, max_size=8))
    elif damage == "random":
        out = draw(st.binary(max_size=12))
    elif damage == "long varint":
        out = out[:draw(st.integers(0, len(out)))] + b"\xff" * 6
    return out


def follow_in_pieces(follower: Any, buf: bytes,
                     pieces: list[tuple[int, int]]) -> tuple[list[int | str], bool]:
    """Feed ``buf`` to a walk's follower (a ``Walker`` or a ``RecordsTail``) piece by piece,
    what it may skip passed unseen: the offsets each feed reached ("failed" last on a
    ``ValueError``), and whether it is done."""
    reached: list[int | str] = []
    try:
        for start, end in pieces:
            while start < end and follower.skippable:
                k = min(follower.skippable, end - start)
                follower.passed(k)
                start += k
            if start < end and not follower.done:
                reached.append(follower.feed(buf, start, end))
    except ValueError:
        reached.append("failed")
    return reached, follower.done
