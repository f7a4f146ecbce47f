"""Fuzz drill: a million hostile frames while good clients keep moving keyed messages.

Request frames go to the proxy over many short connections: valid requests of every API key and
version the proxy offers (fields filled at random, encoded with kio), and the same mutated (bit
flips, truncated and extended bodies, wrong size prefixes including negative and huge ones,
random header tagged fields, odd client-ids, unknown API keys and versions, garbage), written
at random split points, several connections at a time; plus slowloris senders (bytes
dribbled), half-open connections (FIN in the middle of a frame), idle connections and unread
pipelines (thousands of requests, no answer ever read). The proxy runs with short timeouts,
quotas (some fuzz client-ids are limited, the good clients have generous ones), capture and
rack-aware routing on, so every parser of the request path sees the frames; what it accepts
goes on to tansu. Meanwhile ``drill_common.GoodTraffic`` (an idempotent producer and a
consumer) moves keyed messages through the same proxy.

Figures: proxy crashes (the process died or was replaced), tracebacks in its log, good
messages lost/duplicated, RSS and open descriptors before/peak/after, event-loop lag, closes
by reason, and what the fuzz clients themselves saw: responses out of order or to no request,
broker addresses that are not the proxy's, malformed response frames, and connections the proxy
must close (bad sizes, unknown keys, refused versions, stalled headers, FIN mid-frame, idle)
that stayed open.

    python bench/drill_fuzz.py                  # 1,000,000 frames
    python bench/drill_fuzz.py --frames 30000   # as tests/e2e/test_drill_fuzz.py does
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import random
import string
import struct
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE
from kafka_quota_proxy.protocol.headers import (
    encode_request_header,
    parse_response_header,
    produce_acks,
)
from kafka_quota_proxy.protocol.primitives import encode_tagged_fields
from kafka_quota_proxy.protocol.rewrite import decode_response
from testkit.drill_common import (
    GoodTraffic,
    ProcessWatch,
    ProxyProcess,
    loop_lag,
    print_figures,
    tansu_broker,
    traceback_lines,
    wait_for,
)
from testkit.e2e import KafkaWire

NODE = 111  # tansu's node id
MAX_FRAME = 16 << 20  # the proxy's network.max_frame_bytes here
HEADER_S, READ_S, IDLE_S = 1.0, 2.0, 3.0  # the proxy's request header / read / idle timeouts
QUOTA_CLIENTS = ("fuzz-quota-0", "fuzz-quota-1", "fuzz-quota-2", "fuzz-quota-3")
POOL_CLIENTS = tuple(f"fuzz-{i:02d}" for i in range(64))
GOOD = "fuzz-good"

# What a frame does to its connection, as the fuzz client expects it:
CLEAN = "clean"  # valid: answered (unless acks=0), in order
BODY = "body"  # header intact, body damaged: forwarded; the broker answers (in order) or closes
FRAMING = "framing"  # frame boundaries lost: anything may follow; nothing more is sent
CLOSE = "close"  # the proxy must close the connection (and promptly)

# Random requests must not reach the good clients' own state at the broker (that would be
# the fuzz clients' doing, not the proxy's):
# - tansu deletes topics by name prefix (DeleteTopics "" takes every topic's data): no
#   generated string is a prefix of the good clients' topic;
# - InitProducerId with another producer's id fences it: generated producer ids are -1 or
#   far above the ones tansu hands out;
# - and numbers that could make tansu allocate without bound (memory storage) stay small.
_PROTECTED = f"drill-{GOOD}-"
_SMALL = {"num_partitions", "count", "replication_factor"}
_INT_RANGES = {"int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
               "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
               "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
               "uint64": (0, 2**64 - 1)}
_LETTERS = string.ascii_letters + string.digits + "._-"
_ODD_TEXT = "é漢字🙂\u0000\u202e "


def _proxy_yaml(workdir: Path) -> str:
    return f"""network:
  max_frame_bytes: {MAX_FRAME}
  request_header_timeout_seconds: {HEADER_S}
  request_read_timeout_seconds: {READ_S}
  connections_max_idle_seconds: {IDLE_S}
quotas:
  window: {{samples: 5, size_seconds: 1}}
  entities:
    - {{client-id: "{QUOTA_CLIENTS[0]}", producer_byte_rate: 20000}}
    - {{client-id: "{QUOTA_CLIENTS[1]}", consumer_byte_rate: 20000}}
    - {{client-id: "{QUOTA_CLIENTS[2]}", request_percentage: 5}}
    - {{client-id: "{QUOTA_CLIENTS[3]}", producer_byte_rate: 50000, consumer_byte_rate: 50000,
        request_percentage: 20}}
    - {{client-id: "{GOOD}", producer_byte_rate: 100000000}}
    - {{client-id: "{GOOD}-reader", consumer_byte_rate: 100000000}}
capture:
  dir: "{workdir / 'capture'}"
  rotate_seconds: 60
racks:
  brokers: {{{NODE}: a}}
"""


# ---------------------------------------------------------------------------------- generation
class _Filler:
    """Random values for kio entities: mostly small and plausible, sometimes the extremes."""

    def __init__(self, rng: random.Random, batches: list[bytes]) -> None:
        self.rng = rng
        self.batches = batches

    def entity(self, cls: type, depth: int = 0) -> Any:
        from kio.serial._introspect import classify_field, get_field_tag, is_optional

        values = {}
        for f in dataclasses.fields(cls):
            kind = classify_field(f)
            tagged = get_field_tag(f) is not None
            if not tagged and is_optional(f) and self.rng.random() < 0.15:
                values[f.name] = None
                continue
            kafka_type = f.metadata.get("kafka_type", "")
            if kind.is_array:
                n = self._length(depth)
                if dataclasses.is_dataclass(kind.type_):
                    values[f.name] = tuple(self.entity(kind.type_, depth + 1) for _ in range(n))
                else:
                    values[f.name] = tuple(self.primitive(kafka_type, f.name) for _ in range(n))
            elif dataclasses.is_dataclass(kind.type_):
                values[f.name] = self.entity(kind.type_, depth + 1)
            else:
                values[f.name] = self.primitive(kafka_type, f.name)
        return cls(**values)

    def _length(self, depth: int) -> int:
        r = self.rng.random()
        if depth >= 2 or r < 0.75:
            return self.rng.randint(0, 2)
        return self.rng.randint(3, 8) if r < 0.97 else self.rng.randint(9, 40)

    def integer(self, lo: int, hi: int) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.7:
            value = rng.randint(-1, 8)
        elif r < 0.85:
            value = rng.choice((lo, hi, lo + 1, hi - 1, 0, -1))
        else:
            value = rng.randint(lo, hi)
        return min(max(value, lo), hi)

    def text(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.85:
            text = "".join(rng.choices(_LETTERS, k=rng.randint(0, 12)))
        elif r < 0.95:
            text = "".join(rng.choices(_LETTERS + _ODD_TEXT, k=rng.randint(1, 20)))
        else:
            text = "".join(rng.choices(_LETTERS, k=rng.randint(100, 1500)))
        return "z" + text if _PROTECTED.startswith(text) else text

    def primitive(self, kafka_type: str, name: str) -> Any:
        rng = self.rng
        if kafka_type in _INT_RANGES:
            if name in _SMALL:
                return rng.randint(-1, 3)
            if name == "producer_id":
                return rng.choice((-1, rng.randint(2**40, 2**62)))
            return self.integer(*_INT_RANGES[kafka_type])
        if kafka_type == "string":
            return self.text()
        if kafka_type == "bytes":
            return rng.randbytes(rng.choice((0, 1, 8, 16, 64, rng.randint(0, 512))))
        if kafka_type == "records":
            r = rng.random()
            if r < 0.6:
                return rng.choice(self.batches)
            return rng.randbytes(rng.randint(0, 300)) if r < 0.9 else b""
        if kafka_type == "bool":
            return rng.random() < 0.5
        if kafka_type == "uuid":
            return uuid.UUID(int=0) if rng.random() < 0.2 else uuid.UUID(int=rng.getrandbits(128))
        if kafka_type == "error_code":
            from kio.schema.errors import ErrorCode

            return rng.choice(list(ErrorCode))
        if kafka_type == "float64":
            return rng.choice((0.0, 1.0, -1.0, rng.uniform(-1e9, 1e9)))
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            ms = rng.randint(0, 200) if rng.random() < 0.9 else rng.choice((0, 1, 5000, -1))
            return datetime.timedelta(milliseconds=ms)
        if kafka_type == "datetime_i64":
            return datetime.datetime.fromtimestamp(rng.randint(0, 2_000_000_000), datetime.UTC)
        raise ValueError(f"no random value for kafka type {kafka_type!r}")


def _record_batches(rng: random.Random) -> list[bytes]:
    """Valid record batches (magic 2) for Produce requests."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    out = []
    for n in (1, 2, 5, 20):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                            producer_id=-1, producer_epoch=-1,
                                            base_sequence=-1, batch_size=1 << 20)
        for i in range(n):
            builder.append(i, timestamp=None, key=b"k%d" % i,
                           value=rng.randbytes(rng.randint(0, 300)), headers=[])
        out.append(bytes(builder.build()))
    return out


@dataclasses.dataclass(slots=True)
class Frame:
    data: bytes  # with its size prefix
    api_key: int
    version: int
    correlation: int
    header_end: int  # offset of the body in ``data``
    expects_response: bool
    kind: str = "valid"  # or the mutation's name
    effect: str = CLEAN


def _correlation(start: int, i: int) -> int:
    return (start + i + 2**31) % 2**32 - 2**31


# The share of Fetch bodies made a consumer's (replica id -1, no ReplicaState): a random
# replica id makes a follower fetch, which the proxy answers itself (or, damaged, refuses,
# reading nothing more of the connection): the rest stay followers, as a hostile client's
CONSUMER_FETCHES = 0.9


def _as_consumer(value: Any) -> Any:
    changes: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(value)}
    if "replica_id" in names:
        changes["replica_id"] = -1
    if "replica_state" in names:
        changes["replica_state"] = dataclasses.replace(value.replica_state, replica_id=-1)
    return dataclasses.replace(value, **changes) if changes else value


class RequestMaker:
    """Valid requests of every (API key, version) offered, from a pool of random bodies per
    pair (refreshed as frames are drawn), each with a fresh header."""

    def __init__(self, offered: dict[int, tuple[int, int]], rng: random.Random,
                 pool: int = 4, fresh: float = 0.05) -> None:
        from kio.index import load_request_schema

        self.rng = rng
        self.fresh = fresh
        self.filler = _Filler(rng, _record_batches(rng))
        self.schemas: dict[tuple[int, int], type] = {}
        self.borrowed: list[tuple[int, int]] = []  # offered versions kio has no schema of
        self.failures = 0
        for key, (lo, hi) in sorted(offered.items()):
            if key not in API_TABLE:
                continue
            kio_lo, kio_hi = API_TABLE[key][1], API_TABLE[key][2]
            for version in range(lo, hi + 1):
                nearest = min(max(version, kio_lo), kio_hi)
                try:
                    self.schemas[key, version] = load_request_schema(key, nearest)
                except Exception:
                    continue
                if nearest != version:  # sent with the nearest version's body
                    self.borrowed.append((key, version))
        self.pairs = sorted(self.schemas)
        self.pool = {pair: [self._encode(pair) for _ in range(pool)] for pair in self.pairs}

    def _encode(self, pair: tuple[int, int]) -> bytes:
        import io

        from kio.serial import entity_writer

        cls = self.schemas[pair]
        for _ in range(20):
            try:
                value = self.filler.entity(cls)
                if pair[0] == apis.ApiKey.FETCH and self.rng.random() < CONSUMER_FETCHES:
                    value = _as_consumer(value)
                buf = io.BytesIO()
                entity_writer(cls)(buf, value)
                return buf.getvalue()
            except Exception:  # a None or value kio refuses for that field: draw again
                self.failures += 1
        return b""

    def body(self, rng: random.Random, pair: tuple[int, int]) -> bytes:
        bodies = self.pool[pair]
        if rng.random() < self.fresh:
            body = self._encode(pair)
            bodies[rng.randrange(len(bodies))] = body
            return body
        return rng.choice(bodies)

    def frame(self, rng: random.Random, correlation: int, client_id: str | None,
              pair: tuple[int, int] | None = None,
              tags: list[tuple[int, bytes]] | None = None) -> Frame:
        key, version = pair or rng.choice(self.pairs)
        header = encode_request_header(key, version, correlation, client_id, tags)
        body = self.body(rng, (key, version))
        data = struct.pack(">i", len(header) + len(body)) + header + body
        return Frame(data, key, version, correlation, 4 + len(header),
                     _expects_response(data, key, version, 4 + len(header)))


def _expects_response(data: bytes, key: int, version: int, body_at: int) -> bool:
    """As the proxy and the broker read it: every request but a Produce with acks=0."""
    if key != apis.ApiKey.PRODUCE:
        return True
    try:
        return produce_acks(data, body_at, len(data), version) != 0
    except (IndexError, ValueError, struct.error):
        return False  # the proxy closes it (malformed): no answer either way


# ----------------------------------------------------------------------------------- mutation
def _resize(frame: Frame, data: bytes, kind: str, effect: str = BODY) -> Frame:
    data = struct.pack(">i", len(data) - 4) + data[4:]
    expects = frame.expects_response
    if effect == BODY:
        expects = _expects_response(data, frame.api_key, frame.version, frame.header_end)
    return dataclasses.replace(frame, data=data, kind=kind, effect=effect,
                               expects_response=expects)


def _bitflip(rng: random.Random, f: Frame, _: Any) -> Frame:
    data = bytearray(f.data)
    if len(data) <= f.header_end:
        return _body_extend(rng, f, _)
    for _i in range(rng.randint(1, 8)):
        at = rng.randrange(f.header_end, len(data))
        data[at] ^= 1 << rng.randrange(8)
    return _resize(f, bytes(data), "bitflip")


def _byteset(rng: random.Random, f: Frame, _: Any) -> Frame:
    data = bytearray(f.data)
    if len(data) <= f.header_end:
        return _body_extend(rng, f, _)
    for _i in range(rng.randint(1, 4)):
        data[rng.randrange(f.header_end, len(data))] = rng.choice((0, 0xFF, 0x7F, 0x80, 1))
    return _resize(f, bytes(data), "byteset")


def _body_truncate(rng: random.Random, f: Frame, _: Any) -> Frame:
    cut = rng.randint(f.header_end, len(f.data))
    return _resize(f, f.data[:cut], "body_truncate")


def _body_extend(rng: random.Random, f: Frame, _: Any) -> Frame:
    return _resize(f, f.data + rng.randbytes(rng.randint(1, 64)), "body_extend")


def _body_splice(rng: random.Random, f: Frame, _: Any) -> Frame:
    at = rng.randint(f.header_end, len(f.data))
    if rng.random() < 0.5:
        data = f.data[:at] + rng.randbytes(rng.randint(1, 32)) + f.data[at:]
    else:
        data = f.data[:at] + f.data[at + rng.randint(1, 32):]
    return _resize(f, data, "body_splice")


def _body_random(rng: random.Random, f: Frame, _: Any) -> Frame:
    n = rng.choice((0, 1, 2, 4, 8, rng.randint(0, 300)))
    return _resize(f, f.data[: f.header_end] + rng.randbytes(n), "body_random")


def _rebuild(f: Frame, client_id: bytes | None, tags: bytes | None, kind: str,
             version: int | None = None, api_key: int | None = None,
             effect: str = BODY) -> Frame:
    """The frame with another header: raw client-id bytes, raw header tagged fields."""
    key = f.api_key if api_key is None else api_key
    ver = f.version if version is None else version
    parts = [struct.pack(">hhi", key, ver, f.correlation)]
    parts.append(struct.pack(">h", -1) if client_id is None
                 else struct.pack(">h", len(client_id)) + client_id)
    flexible = apis.is_known(key) and apis.request_header_version(key, ver) >= 2
    if flexible:
        parts.append(tags if tags is not None else b"\x00")
    header = b"".join(parts)
    body = f.data[f.header_end:]
    data = struct.pack(">i", len(header) + len(body)) + header + body
    expects = f.expects_response
    if effect == BODY:
        expects = _expects_response(data, key, ver, 4 + len(header))
    return Frame(data, key, ver, f.correlation, 4 + len(header), expects, kind, effect)


def _client_id_of(f: Frame) -> bytes | None:
    n = struct.unpack_from(">h", f.data, 12)[0]
    return None if n < 0 else f.data[14 : 14 + n]


def _header_tags(rng: random.Random, f: Frame, _: Any) -> Frame:
    """Unknown tagged fields in a flexible header (valid: skipped by everyone)."""
    if apis.request_header_version(f.api_key, f.version) < 2:
        return _odd_client_id(rng, f, _)
    tags = sorted({rng.randint(0, 2**20): rng.randbytes(rng.choice((0, 1, 4, 64, 700)))
                   for _ in range(rng.randint(1, 4))}.items())
    return _rebuild(f, _client_id_of(f), encode_tagged_fields(tags), "header_tags")


def _odd_client_id(rng: random.Random, f: Frame, _: Any) -> Frame:
    choice = rng.choice((None, b"", b"\xff\xfe\xc0", "漢字🙂".encode(),
                         rng.randbytes(rng.randint(1, 40)), b"x" * rng.randint(1000, 32767)))
    return _rebuild(f, choice, None, "odd_client_id")


def _version_forwarded(rng: random.Random, f: Frame, maker: RequestMaker) -> Frame:
    """A version the proxy does not offer but forwards (it reads nothing of those bodies):
    the broker's to refuse. Else a refused one."""
    version = rng.choice((f.version + 1, f.version + rng.randint(2, 100), 32767))
    if apis.accepts_request_version(f.api_key, version):
        return _rebuild(f, _client_id_of(f), None, "version_forwarded", version=version)
    return _rebuild(f, _client_id_of(f), None, "version_refused", version=version,
                    effect=CLOSE)


def _version_refused(rng: random.Random, f: Frame, _: Any) -> Frame:
    version = rng.choice((-1, -2**15, rng.randint(-100, -1)))
    key = rng.choice((apis.ApiKey.METADATA, apis.ApiKey.FIND_COORDINATOR, apis.ApiKey.PRODUCE,
                      apis.ApiKey.FETCH, apis.ApiKey.DESCRIBE_CLUSTER, f.api_key))
    if rng.random() < 0.5:  # above what the proxy can decode the answer of
        key = rng.choice((apis.ApiKey.METADATA, apis.ApiKey.FIND_COORDINATOR,
                          apis.ApiKey.DESCRIBE_CLUSTER, apis.ApiKey.FETCH))
        version = API_TABLE[key][2] + rng.randint(1, 50)
    if apis.accepts_request_version(key, version):
        version = -1
    return _rebuild(f, _client_id_of(f), None, "version_refused", version=version,
                    api_key=key, effect=CLOSE)


def _api_key_unknown(rng: random.Random, f: Frame, _: Any) -> Frame:
    key = rng.choice((4, 5, 6, 7, -1, 9999, 32767, -(2**15), rng.randint(100, 30000)))
    if apis.is_known(key):
        key = 9999
    return _rebuild(f, _client_id_of(f), None, "api_key_unknown", api_key=key, effect=CLOSE)


def _size_negative(rng: random.Random, f: Frame, _: Any) -> Frame:
    size = rng.choice((-1, -(2**31), rng.randint(-(2**31), -1)))
    return dataclasses.replace(f, data=struct.pack(">i", size) + f.data[4:],
                               kind="size_negative", effect=CLOSE)


def _size_huge(rng: random.Random, f: Frame, _: Any) -> Frame:
    size = rng.choice((MAX_FRAME + 1, 2**31 - 1, rng.randint(MAX_FRAME + 1, 2**31 - 1)))
    return dataclasses.replace(f, data=struct.pack(">i", size) + f.data[4:],
                               kind="size_huge", effect=CLOSE)


def _size_tiny(rng: random.Random, f: Frame, _: Any) -> Frame:
    """A size too small for any request header, whole."""
    size = rng.randint(0, 7)
    return dataclasses.replace(f, data=struct.pack(">i", size) + f.data[4 : 4 + size],
                               kind="size_tiny", effect=CLOSE)


def _header_tags_broken(rng: random.Random, f: Frame, _: Any) -> Frame:
    """Header tagged fields that run past the frame's end (or an overlong varint): the header
    does not parse in a whole frame."""
    if apis.request_header_version(f.api_key, f.version) < 2:
        return _size_tiny(rng, f, _)
    tags = rng.choice((b"\x01\x05\xff\xff\xff\x7f", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
                       b"\x7f\x01\x02", b"\x02\x00\x80\x80\x80\x80\x08"))
    rebuilt = _rebuild(f, _client_id_of(f), tags, "header_tags_broken", effect=CLOSE)
    # no body: the bad tagged fields reach the frame's end
    data = rebuilt.data[: rebuilt.header_end]
    return dataclasses.replace(rebuilt, data=struct.pack(">i", len(data) - 4) + data[4:])


def _http(rng: random.Random, f: Frame, _: Any) -> Frame:
    data = rng.choice((b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
                       b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(32),
                       b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"))
    return dataclasses.replace(f, data=data, kind="http_tls", effect=CLOSE)


def _size_off(rng: random.Random, f: Frame, _: Any) -> Frame:
    size = len(f.data) - 4 + rng.choice((-1, 1, -4, 4, rng.randint(-64, 64)))
    size = max(size, 8)
    return dataclasses.replace(f, data=struct.pack(">i", size) + f.data[4:],
                               kind="size_off", effect=FRAMING)


def _truncate_then_next(rng: random.Random, f: Frame, _: Any) -> Frame:
    return dataclasses.replace(f, data=f.data[: rng.randint(1, len(f.data) - 1)],
                               kind="truncated", effect=FRAMING)


def _garbage(rng: random.Random, f: Frame, _: Any) -> Frame:
    n = rng.randint(1, 200)
    data = rng.randbytes(n) if rng.random() < 0.5 else struct.pack(">i", n) + rng.randbytes(n)
    return dataclasses.replace(f, data=data, kind="garbage", effect=FRAMING)


def _duplicate_correlation(rng: random.Random, f: Frame, _: Any) -> Frame:
    """The frame twice with one correlation id: refused if the first is still in flight."""
    return dataclasses.replace(f, data=f.data + f.data, kind="duplicate_correlation",
                               effect=FRAMING)


Mutation = Callable[[random.Random, Frame, Any], Frame]
MUTATIONS: list[tuple[Mutation, float]] = [
    (_bitflip, 14), (_byteset, 8), (_body_truncate, 8), (_body_extend, 5), (_body_splice, 6),
    (_body_random, 6), (_header_tags, 8), (_odd_client_id, 5), (_version_forwarded, 3),
    (_version_refused, 2), (_api_key_unknown, 2), (_size_negative, 1), (_size_huge, 1),
    (_size_tiny, 1), (_header_tags_broken, 1), (_http, 0.5),
    (_size_off, 1.5), (_truncate_then_next, 1.5), (_garbage, 1.5), (_duplicate_correlation, 1),
]


# ------------------------------------------------------------------------------------ clients
class Connection:
    """One fuzz connection: the writer, and what the reader saw."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 quota: bool) -> None:
        self.reader = reader
        self.writer = writer
        self.quota = quota  # a client-id with a quota: the proxy reads it one request at a time
        self.expected: deque[Frame] = deque()  # sent, awaiting their answer (in order)
        self.expected_ids: set[int] = set()
        self.checked = True  # frame boundaries intact so far: answers must match, in order
        self.closed = asyncio.Event()  # the proxy closed (EOF or reset)
        self.answered = asyncio.Event()  # nothing expected is outstanding
        self.answered.set()
        self.ending = False  # the fuzz client is closing it
        self.sent: dict[int, Frame] = {}  # by correlation id (for the figures' samples)
        self.closed_at = 0.0

    def expect(self, frame: Frame) -> None:
        self.sent[frame.correlation] = frame
        if self.checked and frame.expects_response and frame.effect in (CLEAN, BODY):
            self.expected.append(frame)
            self.expected_ids.add(frame.correlation)
            self.answered.clear()

    def send(self, data: bytes) -> bool:
        """Write unless the connection is closing (the proxy closed it): whether written."""
        if self.writer.transport.is_closing():
            return False
        self.writer.write(data)
        return True

    def fin(self) -> None:
        """Half-close (shutdown SHUT_WR): the proxy sees EOF; answers may still come back."""
        self.ending = True
        if not self.writer.transport.is_closing():
            self.writer.write_eof()

    def abort(self) -> None:
        self.ending = True
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


class Fuzzer:
    def __init__(self, maker: RequestMaker, ports: list[int], proxy_ports: tuple[int, int],
                 upstream_port: int, frames: int, seconds: float, seed: int, workers: int,
                 fresh_client_ids: float) -> None:
        self.maker = maker
        self.ports = ports
        self.proxy_ports = proxy_ports
        self.upstream_port = upstream_port
        self._port_bytes = struct.pack(">i", upstream_port)
        self.target = frames
        self.seconds = seconds
        self.seed = seed
        self.workers = workers
        self.fresh_client_ids = fresh_client_ids
        self.counts: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()  # frames by kind ("valid" or a mutation)
        self.pairs_sent: set[tuple[int, int]] = set()
        # per (API key, version, effect): answered, or the first unanswered when the other side
        # ended the connection
        self.answered: Counter[tuple[int, int, str]] = Counter()
        self.ended: Counter[tuple[int, int, str]] = Counter()
        self.client_ids: set[str] = set()
        self.must_close_s: list[float] = []
        self.samples: dict[str, list[str]] = collections.defaultdict(list)
        self._mutations = [m for m, _ in MUTATIONS]
        self._weights = [w for _, w in MUTATIONS]
        self._deadline = 0.0
        self._readers: set[asyncio.Task[None]] = set()

    # -------------------------------------------------------------------------- the run
    def run(self) -> None:
        try:
            import uvloop

            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        with runner:
            runner.run(self._main())

    async def _main(self) -> None:
        self._deadline = time.monotonic() + self.seconds
        workers = [self._worker(i, self._session) for i in range(self.workers)]
        workers += [self._worker(1000 + i, self._slowloris) for i in range(3)]
        workers.append(self._worker(2000, self._idle))
        await asyncio.gather(*workers)
        for task in list(self._readers):  # connections the proxy has not closed yet
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)

    def _stopping(self) -> bool:
        return self.counts["frames"] >= self.target or time.monotonic() > self._deadline

    async def _worker(self, i: int, session: Callable[[random.Random], Any]) -> None:
        rng = random.Random(self.seed * 10_007 + i)
        while not self._stopping():
            try:
                await session(rng)
            except (ConnectionError, OSError, TimeoutError):
                self.counts["session_errors"] += 1

    def _note(self, what: str, detail: str) -> None:
        self.counts[what] += 1
        if len(self.samples[what]) < 5:
            self.samples[what].append(detail)

    # -------------------------------------------------------------------------- plumbing
    async def _open(self, rng: random.Random, quota: bool = False,
                    read: bool = True) -> Connection | None:
        port = rng.choice(self.ports)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:  # the proxy gone (or out of descriptors)
            self._note("connect_failures", repr(exc))
            await asyncio.sleep(0.1)
            return None
        self.counts["connections"] += 1
        conn = Connection(reader, writer, quota)
        if read:
            task = asyncio.get_running_loop().create_task(self._read(conn))
            self._readers.add(task)  # (a task only the loop references may be collected)
            task.add_done_callback(self._readers.discard)
        return conn

    async def _read(self, conn: Connection) -> None:
        reader = conn.reader
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                if size < 4 or size > MAX_FRAME:
                    self._note("bad_response_frames", f"size {size}")
                    break
                self._on_response(conn, await reader.readexactly(size))
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.counts["responses_cut_at_close"] += 1
        except (ConnectionError, OSError):
            pass
        conn.closed_at = time.monotonic()
        if conn.checked and conn.expected and not conn.ending:
            frame = conn.expected[0]
            self.ended[frame.api_key, frame.version, frame.effect] += 1
            self.counts["closed_by_peer"] += 1
        conn.closed.set()
        conn.answered.set()

    def _on_response(self, conn: Connection, body: bytes) -> None:
        self.counts["responses"] += 1
        correlation = struct.unpack_from(">i", body)[0]
        if correlation not in conn.expected_ids:
            if conn.checked:
                sent = conn.sent.get(correlation)
                what = (f"{apis.api_name(sent.api_key)} v{sent.version} {sent.kind} "
                        f"expects={sent.expects_response}" if sent else "no such request")
                self._note("correlation_errors", f"answer to {correlation} ({what}), "
                           f"expected {[f.correlation for f in list(conn.expected)[:3]]}")
            else:
                self.counts["responses_after_framing_mutants"] += 1
            return
        while True:  # in order: what comes before it was not answered (acks=0 or refused)
            frame = conn.expected.popleft()
            conn.expected_ids.discard(frame.correlation)
            if frame.correlation == correlation:
                break
            self.counts["requests_skipped_by_answers"] += 1
        if not conn.expected:
            conn.answered.set()
        self.answered[frame.api_key, frame.version, frame.effect] += 1
        self._check_addresses(frame, body)

    def _check_addresses(self, frame: Frame, body: bytes) -> None:
        """Every broker port in an answer is one of the proxy's: decoded where the proxy
        rewrites the whole response, searched for the broker's port elsewhere."""
        key, version = frame.api_key, frame.version
        if not apis.needs_response_rewrite(key, version) or key == apis.ApiKey.API_VERSIONS:
            return
        if key in (apis.ApiKey.METADATA, apis.ApiKey.FIND_COORDINATOR,
                   apis.ApiKey.DESCRIBE_CLUSTER):
            self.counts["address_answers_decoded"] += 1
        elif self._port_bytes not in body:
            return
        try:
            header = parse_response_header(body, 0, len(body),
                                           apis.response_header_version(key, version))
            value = decode_response(key, version, body[header.size:])
        except Exception as exc:
            self._note("undecodable_rewritten_answers",
                       f"{apis.api_name(key)} v{version}: {exc!r}"[:300])
            return
        first, last = self.proxy_ports
        for port in _ports(value):
            if port > 0 and not first <= port <= last:
                self._note("upstream_addresses_leaked",
                           f"{apis.api_name(key)} v{version}: port {port}")

    async def _write(self, conn: Connection, rng: random.Random, data: bytes) -> None:
        """``data`` at random split points, some of them apart in time."""
        writer = conn.writer
        n = len(data)
        if n < 2 or rng.random() < 0.4:
            conn.send(data)
        else:
            cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(1, 8))))
            prev = 0
            for cut in (*cuts, n):
                if not conn.send(data[prev:cut]):
                    return
                prev = cut
                if rng.random() < 0.25:
                    await asyncio.sleep(0)
        if not writer.transport.is_closing():
            await asyncio.wait_for(writer.drain(), 10)

    def _client_id(self, rng: random.Random, persona: str | None) -> str | None:
        if persona is not None:
            return persona
        r = rng.random()
        if r < self.fresh_client_ids:
            cid = "".join(rng.choices(_LETTERS, k=rng.randint(1, 24)))
            self.client_ids.add(cid)
            return cid
        return rng.choice(POOL_CLIENTS) if r < 0.98 else rng.choice((None, ""))

    def _next(self, rng: random.Random, state: list[int], persona: str | None = None,
              mutate: float = 0.0, kind: str | None = None,
              pair: tuple[int, int] | None = None) -> Frame:
        """The connection's next frame (``state``: first correlation id, frames so far)."""
        start, i = state
        state[1] += 1
        frame = self.maker.frame(rng, _correlation(start, i), self._client_id(rng, persona),
                                 pair)
        self.pairs_sent.add((frame.api_key, frame.version))
        if rng.random() < mutate:
            mutation = rng.choices(self._mutations, self._weights)[0]
            frame = mutation(rng, frame, self.maker)
        elif kind is not None:
            frame.kind = kind
        self.kinds[frame.kind] += 1
        return frame

    async def _must_close(self, conn: Connection, what: str, limit: float,
                          since: float | None = None, counted: bool = True) -> bool:
        """Whether the proxy closes this connection within ``limit`` seconds (counted, and
        asserted by the suite, unless ``counted`` is false)."""
        since = time.monotonic() if since is None else since
        try:
            await asyncio.wait_for(conn.closed.wait(), limit)
        except TimeoutError:
            if counted:
                self.counts["must_close_sent"] += 1
                self._note("must_close_missed", f"{what}: open after {limit:g} s")
            else:
                self._note("quota_close_late", what)
            return False
        if counted:
            self.counts["must_close_sent"] += 1
            self.must_close_s.append(conn.closed_at - since)
        return True

    async def _finish(self, conn: Connection, rng: random.Random) -> None:
        """End a connection: close, reset, or FIN and the proxy's FIN back (a client with a
        quota may be read no further until an answer comes: FIN is not awaited there)."""
        r = rng.random()
        if conn.closed.is_set() or r < 0.6:
            conn.ending = True
            conn.writer.close()
        elif r < 0.8 or conn.quota:
            conn.abort()
        else:
            conn.fin()
            await self._must_close(conn, "FIN between frames", 5.0)

    # -------------------------------------------------------------------------- sessions
    async def _session(self, rng: random.Random) -> None:
        r = rng.random()
        if r < 0.004:
            await self._unread(rng)
        elif r < 0.03:
            await self._half_open(rng)
        else:
            await self._pipeline(rng)

    async def _pipeline(self, rng: random.Random) -> None:
        """Requests written at random split points, some mutated, answers read as they come.
        After a mutant that loses the frame boundaries, the rest follows all the same (and
        answers are no longer checked); after one the proxy must refuse, nothing more.

        tansu closes a connection on any request it fails to handle (an unknown group, a
        field value it refuses, a body that does not decode), and with it everything
        pipelined behind. So that most frames are read and answered, the requests most
        likely to end a connection (learnt as the drill goes) are sent last."""
        quota = rng.random() < 0.06
        persona = rng.choice(QUOTA_CLIENTS) if quota else (
            rng.choice(POOL_CLIENTS) if rng.random() < 0.3 else None)
        n = rng.randint(1, 15) if quota else rng.choice(
            (rng.randint(1, 10), rng.randint(10, 100), rng.randint(100, 400)))
        mutate = rng.choice((0.0, 0.05, 0.15, 0.3, 0.6))
        state = [rng.choice((0, 1, -(2**31), 2**31 - 1000, rng.getrandbits(31))), 0]
        frames: list[Frame] = []
        while len(frames) < n:
            frame = self._next(rng, state, persona, mutate)
            frames.append(frame)
            if frame.effect == CLOSE:
                break
        refused = frames.pop() if frames[-1].effect == CLOSE else None
        if refused is not None:
            # A damaged Fetch the topic guard must read (a replica id: a client posing as a
            # follower) and cannot is refused: the proxy reads nothing more and closes once
            # what came before it is answered (as Kafka, reading one request at a time), so
            # the frame that must close the connection would never be read
            frames = [f for f in frames
                      if not (f.effect == BODY and f.api_key == apis.ApiKey.FETCH)]
        frames.sort(key=self._risk)
        if refused is not None:
            frames.append(refused)
        conn = await self._open(rng, quota)
        if conn is None:
            return
        sent = 0
        try:
            while sent < len(frames) and not conn.closed.is_set():
                group = frames[sent : sent + rng.choice((1, 1, 2, 4, 8, 32))]
                for frame in group:
                    conn.expect(frame)
                    if frame.effect in (FRAMING, CLOSE):
                        conn.checked = False
                await self._write(conn, rng, b"".join(f.data for f in group))
                sent += len(group)
                self.counts["frames"] += len(group)
            if sent < len(frames):
                self.counts["frames_not_sent_connection_closed"] += len(frames) - sent
            wait = 15.0 if quota else 5.0
            if refused is not None and sent == len(frames):
                await self._must_close(conn, refused.kind, wait, counted=not quota)
            elif conn.checked:
                try:
                    await asyncio.wait_for(conn.answered.wait(), wait)
                except TimeoutError:
                    self.counts["answers_waited_out"] += 1
            await self._finish(conn, rng)
        finally:
            conn.abort()

    def _risk(self, frame: Frame) -> float:
        """Sort key: frames that may end the connection last (the more likely, the later)."""
        if frame.effect == FRAMING:
            return 2.0
        if frame.effect == BODY and frame.api_key in (apis.ApiKey.FETCH, apis.ApiKey.PRODUCE):
            # a damaged follower fetch, or a Produce the topic guard cannot follow, is refused
            # (nothing after it is read; the connection closes at once where the Produce's
            # first bytes went upstream with an earlier read)
            return 1.5
        key = (frame.api_key, frame.version, frame.effect)
        return (self.ended[key] + 0.5) / (self.ended[key] + self.answered[key] + 1)

    async def _half_open(self, rng: random.Random) -> None:
        """A few requests, then part of one and FIN: the proxy must close (truncated frame)."""
        conn = await self._open(rng)
        if conn is None:
            return
        state = [rng.getrandbits(20), 0]
        try:
            frames = [self._next(rng, state) for _ in range(rng.randint(0, 5))]
            for frame in frames:
                conn.expect(frame)
            last = self._next(rng, state, kind="half_open")
            cut = rng.randint(1, len(last.data) - 1)
            await self._write(conn, rng, b"".join(f.data for f in frames) + last.data[:cut])
            self.counts["frames"] += len(frames) + 1
            conn.fin()
            await self._must_close(conn, "FIN mid-frame", 5.0)
        finally:
            conn.abort()

    async def _unread(self, rng: random.Random) -> None:
        """Pipelined requests, never an answer read, until the proxy stops reading them."""
        conn = await self._open(rng, read=False)
        if conn is None:
            return
        state = [rng.getrandbits(20), 0]
        cap = rng.randint(500, 5000)
        sent = 0
        start = time.monotonic()
        try:
            while sent < cap and time.monotonic() - start < 3 and not self._stopping():
                batch = [self._next(rng, state, kind="unread") for _ in range(100)]
                if not conn.send(b"".join(f.data for f in batch)):
                    break
                sent += len(batch)
                self.counts["frames"] += len(batch)
                try:
                    await asyncio.wait_for(conn.writer.drain(), 0.5)
                except TimeoutError:  # the proxy stopped reading: the bound holds
                    self.counts["unread_held_back"] += 1
                    break
        finally:
            if rng.random() < 0.5:
                conn.writer.close()
            conn.abort()

    async def _slowloris(self, rng: random.Random) -> None:
        """One request dribbled: a header too slow (closed), a body too slow (closed), or a
        whole small request just in time (answered)."""
        conn = await self._open(rng)
        if conn is None:
            return
        state = [rng.getrandbits(20), 0]
        mode = rng.choice(("header", "body", "in_time"))
        versions = [p for p in self.maker.pairs if p[0] == apis.ApiKey.API_VERSIONS
                    and p[1] <= 2]  # (no body: small)
        pair = rng.choice(versions) if mode == "in_time" and versions else None
        frame = self._next(rng, state, "slow" if pair else None, kind=f"slow_{mode}",
                           pair=pair)
        self.counts["frames"] += 1
        first = time.monotonic()
        try:
            if pair is not None:
                conn.expect(frame)
                for b in frame.data:
                    conn.send(bytes([b]))
                    await asyncio.sleep(HEADER_S / 4 / len(frame.data))
                try:
                    await asyncio.wait_for(conn.answered.wait(), 10)
                    self.counts["slow_answered"] += 1
                except TimeoutError:
                    self._note("slow_unanswered", f"{frame.api_key} v{frame.version}")
                return
            if mode == "header":
                dribble = frame.data[: frame.header_end - 1]
                limit = HEADER_S + 3
            else:  # the header whole, then a body (made longer) at a pace that cannot finish
                extra = rng.randbytes(200)
                dribble = frame.data[frame.header_end:] + extra
                conn.send(struct.pack(">i", len(frame.data) - 4 + len(extra))
                          + frame.data[4 : frame.header_end])
                limit = READ_S + 3
            for b in dribble:
                if conn.closed.is_set() or time.monotonic() - first > limit:
                    break
                conn.send(bytes([b]))
                await asyncio.sleep(rng.uniform(0.2, 0.4))
            await self._must_close(conn, f"slow {mode}",
                                   max(limit - (time.monotonic() - first), 0.1), since=first)
        finally:
            conn.abort()

    async def _idle(self, rng: random.Random) -> None:
        """Connect (perhaps one answered request), then nothing: closed after the idle time."""
        conn = await self._open(rng)
        if conn is None:
            return
        try:
            if rng.random() < 0.5 and (18, 0) in self.maker.schemas:
                frame = self._next(rng, [1, 0], "idle", kind="idle", pair=(18, 0))
                conn.expect(frame)
                conn.send(frame.data)
                self.counts["frames"] += 1
                await asyncio.wait_for(conn.answered.wait(), 10)
            first = time.monotonic()
            await self._must_close(conn, "idle", IDLE_S + 3, since=first)
        finally:
            conn.abort()


def _ports(value: Any) -> list[int]:
    """Every ``port`` field in a decoded kio response."""
    out = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(v)
        elif dataclasses.is_dataclass(v):
            for f in dataclasses.fields(v):
                item = getattr(v, f.name)
                if f.name == "port" and isinstance(item, int):
                    out.append(item)
                elif isinstance(item, tuple) or dataclasses.is_dataclass(item):
                    stack.append(item)
    return out


def _offered(port: int) -> dict[int, tuple[int, int]]:
    """The API keys and versions the proxy offers (its ApiVersions answer)."""
    with KafkaWire("127.0.0.1", port) as wire:
        answer = wire.request(18, 3, client_software_name="drill-fuzz",
                              client_software_version="1")
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in answer.api_keys}


def _broker_abort(log: Path) -> str:
    """The line of the broker's log that says why it died."""
    lines = [line for line in log.read_text(errors="replace").splitlines()
             if "memory allocation" in line or "panicked" in line or "abort" in line]
    return lines[-1][:200] if lines else "(no reason in its log)"


def _total(metrics: dict[str, float], before: dict[str, float], prefix: str) -> int:
    """The growth of every series whose name starts with ``prefix``, summed."""
    return int(sum(v - before.get(k, 0.0) for k, v in metrics.items() if k.startswith(prefix)))


def _closes(metrics: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    prefix = 'kafka_proxy_connections_closed_total{reason="'
    return {k[len(prefix):-2]: int(v - before.get(k, 0)) for k, v in sorted(metrics.items())
            if k.startswith(prefix) and v - before.get(k, 0) > 0}


def _produce_closes_at_once(log: Path) -> int:
    """Connections closed at once on a Produce the topic guard refused, from the proxy's log:
    its first bytes had gone upstream with an earlier read, so it could not be cut out."""
    if not log.exists():
        return 0
    n = 0
    with log.open(errors="replace") as lines:
        for line in lines:
            if '"connection_closed"' not in line or "closed at once" not in line:
                continue
            try:
                detail = str(json.loads(line).get("detail", ""))
            except ValueError:
                continue
            n += detail.startswith("Produce")
    return n


def run(frames: int = 1_000_000, seconds_cap: float = 1200.0, seed: int = 1,
        workers: int = 16, good_rate: float = 500.0, fresh_client_ids: float = 0.2,
        workdir: Path | None = None) -> dict[str, Any]:
    """The drill; returns its figures."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="drill-fuzz-"))
    with tansu_broker(str(workdir / "tansu.log")) as broker:
        proxy = ProxyProcess(broker.bootstrap, workdir=workdir, extra_yaml=_proxy_yaml(workdir))
        proxy.start()
        try:
            port = proxy.wait_broker_listener(NODE)
            assert proxy.process is not None
            pid = proxy.process.pid
            offered = _offered(port)
            t0 = time.monotonic()
            maker = RequestMaker(offered, random.Random(seed))
            generation_s = time.monotonic() - t0
            good = GoodTraffic(proxy.bootstrap, rate=good_rate, name=GOOD).start()
            wait_for(lambda: len(good.acked) >= 50 and good.consumed, 60, interval=0.2,
                     what="the good clients moving")
            before = proxy.metrics()
            watch = ProcessWatch(pid, every=0.5).start()
            fuzzer = Fuzzer(maker, [proxy.bootstrap_port, port], proxy.ports,
                            int(broker.bootstrap.rsplit(":", 1)[1]), frames, seconds_cap,
                            seed, workers, fresh_client_ids)
            start = time.monotonic()
            fuzzer.run()
            duration = time.monotonic() - start
            if not proxy.alive:  # say how it died rather than fail on its closed /metrics
                tail = proxy.log_path.read_text(errors="replace").splitlines()[-40:]
                raise AssertionError("the proxy died under the fuzz:\n" + "\n".join(
                    line for line in tail if not line.startswith("{"))[-4000:])
            during = proxy.metrics()
            # The proxy lets go of every fuzz connection (the good clients keep theirs).
            fds_start = watch.fds[0]
            settle = time.monotonic()
            with contextlib.suppress(AssertionError):
                wait_for(lambda: watch.process.num_fds() <= fds_start + 4, 60, interval=0.2,
                         what="the proxy's descriptors back near the start")
            settle_s = time.monotonic() - settle
            process = watch.stop()
            tally = good.stop()
            after = proxy.metrics()
            alive = proxy.alive and proxy.process.pid == pid
            broker_alive = broker.process is not None and broker.process.poll() is None
        finally:
            proxy.stop()
    lag = loop_lag(during, before)
    # Produce frames the topic guard refused (one its walk cannot follow, or below v3 naming a
    # guarded topic): cut out after what came before them was answered, or closed at once
    guarded = 'kafka_proxy_guarded_topic_connections_closed_total{reason="'
    refused = sum(_total(after, before, f'{guarded}{reason}"}}')
                  for reason in ("produce_unparsed", "produce_version"))
    at_once = _produce_closes_at_once(proxy.log_path)
    close_s = sorted(fuzzer.must_close_s)
    counts = fuzzer.counts
    mutated = sum(n for k, n in fuzzer.kinds.items() if k != "valid")
    figures: dict[str, Any] = {
        "frames_sent": counts["frames"],
        "frames_mutated": mutated,
        "requests_read_by_proxy": _total(after, before, "kafka_proxy_requests_total{"),
        "responses_rewritten": _total(after, before, "kafka_proxy_responses_rewritten_total{"),
        "connections": counts["connections"],
        "duration_s": round(duration, 1),
        "frames_per_s": round(counts["frames"] / max(duration, 1e-9)),
        "versions_offered": len(maker.pairs),
        "versions_sent": len(fuzzer.pairs_sent),
        "versions_without_kio_schema": len(maker.borrowed),
        "pool_generation_s": round(generation_s, 1),
        "proxy_alive": alive,
        # The frames reach the broker as the clients sent them (the proxy reads request bodies
        # only where a feature needs them): a mutated array length can make tansu 0.6 abort
        # ("memory allocation of 103079215104 bytes failed"). Its own crash, reported apart;
        # the good clients' messages not yet consumed then are lost with it.
        "broker_alive": broker_alive,
        "broker_abort": "" if broker_alive else _broker_abort(workdir / "tansu.log"),
        "proxy_crashes": 0 if alive else 1,
        "tracebacks": traceback_lines(proxy),
        "internal_errors": _closes(after, before).get("internal_error", 0),
        "good_acked": tally.acked,
        "good_lost": tally.lost,
        "good_duplicated": tally.duplicated,
        "good_errors": len(tally.errors),
        "good_produce_p99_ms": round(tally.produce_latency_p99_ms, 1),
        "loop_lag_p50_ms": lag["loop_lag_p50_ms"],
        "loop_lag_p99_ms": lag["loop_lag_p99_ms"],
        "rss_start_mb": round(process["rss_start_mb"], 1),
        "rss_peak_mb": round(process["rss_peak_mb"], 1),
        "rss_end_mb": round(process["rss_end_mb"], 1),
        "fds_start": process["fds_start"],
        "fds_peak": process["fds_peak"],
        "fds_end": process["fds_end"],
        "fds_settle_s": round(settle_s, 1),
        "responses": counts["responses"],
        "produce_refused": refused - at_once,
        "produce_closed_at_once": at_once,
        "correlation_errors": counts["correlation_errors"],
        "bad_response_frames": counts["bad_response_frames"],
        "address_answers_decoded": counts["address_answers_decoded"],
        "upstream_addresses_leaked": counts["upstream_addresses_leaked"],
        "undecodable_rewritten_answers": counts["undecodable_rewritten_answers"],
        "must_close_sent": counts["must_close_sent"],
        "must_close_missed": counts["must_close_missed"],
        "must_close_p99_s": round(close_s[int(len(close_s) * 0.99)], 2) if close_s else 0.0,
        "connect_failures": counts["connect_failures"],
        "slow_answered": counts["slow_answered"],
        "slow_unanswered": counts["slow_unanswered"],
        "unread_held_back": counts["unread_held_back"],
        "fresh_client_ids": len(fuzzer.client_ids),
        "quota_throttled": _total(after, before, "kafka_proxy_quota_throttled_requests"),
        "capture_records": int(after.get("kafka_proxy_capture_records_total", 0)),
        "capture_dropped": int(after.get("kafka_proxy_capture_dropped_records_total", 0)),
        "closes": _closes(after, before),
        "frames_by_kind": dict(fuzzer.kinds.most_common()),
        "samples": {k: v for k, v in fuzzer.samples.items() if v},
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--seconds-cap", type=float, default=1200.0,
                        help="stop fuzzing after this long even if fewer frames went")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=16,
                        help="concurrent fuzz connections (plus 3 slowloris and 1 idle)")
    parser.add_argument("--good-rate", type=float, default=500.0,
                        help="the good producer's messages per second")
    parser.add_argument("--fresh-client-ids", type=float, default=0.2,
                        help="share of requests with a client-id never seen before")
    args = parser.parse_args()
    figures = run(args.frames, args.seconds_cap, args.seed, args.workers, args.good_rate,
                  args.fresh_client_ids)
    print_figures(f"fuzz ({args.frames:,} frames, seed {args.seed})", figures)


if __name__ == "__main__":
    main()
