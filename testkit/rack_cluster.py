"""A test-only multi-rack Kafka "cluster" over one real broker, for rack-aware fetch tests.

tansu is a single node (id 111, no rack) that serves every partition. ``RackCluster`` puts
one thin forwarder per simulated broker in front of it: each listens on its own 127.0.0.1
port, presents itself as a distinct node id with a rack, and rewrites the responses that
describe the cluster (Metadata, FindCoordinator, DescribeCluster) so that every partition has
all the simulated nodes as replicas and a configurable leader. The data path stays the real
broker: every client connection to a forwarder opens its own upstream connection to tansu and
the bytes go through unchanged, except:

- ApiVersions: Fetch is capped at v15 and Produce at v9 (below KIP-951, whose
  ``node_endpoints`` would name tansu's node 111), and Metadata, FindCoordinator and
  DescribeCluster at the highest versions kio decodes;
- with ``broker_preferred``, the leader's Fetch (v11+) responses carry a
  ``preferred_read_replica`` (and no records) for the partitions it picks, as a Kafka broker
  running a replica selector (KIP-392) does.

What each node was asked for is recorded too (``fetch_asks``: every Fetch v11+ request's
``min_bytes``, ``max_bytes`` and per-partition ``partition_max_bytes``, decoded by kio).

``stop_node`` makes a node go away like a dead broker. The forwarders run on an asyncio loop
in a daemon thread; the public methods are called from the test thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.index import load_entity_module, load_request_schema
from kio.schema.index import api_key_map
from kio.schema.types import BrokerId
from kio.serial import entity_reader
from kio.static.constants import EntityType
from kio.static.primitive import i32

from kafka_quota_proxy.protocol import apis, rewrite
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.fetch import (
    FetchRequestSummary,
    parse_fetch_request,
    set_preferred_read_replicas,
)
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kafka_quota_proxy.protocol.headers import (
    parse_request_header,
    parse_response_header,
    produce_acks,
)
from kafka_quota_proxy.protocol.primitives import INT16, INT32
from kafka_quota_proxy.protocol.response_stream import ResponseStream
from kafka_quota_proxy.protocol.rewrite import decode_response, encode_entity

HOST = "127.0.0.1"

_PRODUCE = int(apis.ApiKey.PRODUCE)
_FETCH = int(apis.ApiKey.FETCH)
_METADATA = int(apis.ApiKey.METADATA)
_FIND_COORDINATOR = int(apis.ApiKey.FIND_COORDINATOR)
_API_VERSIONS = int(apis.ApiKey.API_VERSIONS)
_DESCRIBE_CLUSTER = int(apis.ApiKey.DESCRIBE_CLUSTER)
_UNSUPPORTED_VERSION = 35


def _kio_max(api_key: int) -> int:
    return apis.kio_version_range(api_key)[1]


# Highest version offered to clients, per API key (see the module docstring).
VERSION_CAPS: dict[int, int] = {
    _PRODUCE: 9,
    _FETCH: 15,
    _METADATA: _kio_max(_METADATA),
    _FIND_COORDINATOR: _kio_max(_FIND_COORDINATOR),
    _DESCRIBE_CLUSTER: _kio_max(_DESCRIBE_CLUSTER),
}

Leaders = Callable[[str, int], int]


@dataclasses.dataclass(frozen=True)
class FetchAsk:
    """What one consumer Fetch (v11+) asked a node for."""

    node: int
    version: int
    session_epoch: int
    min_bytes: int
    max_bytes: int
    partitions: tuple[tuple[str | bytes, int, int], ...]  # (topic, partition, max bytes)

    @property
    def asks_for_nothing(self) -> bool:
        """Every listed partition, and the whole request, asked for 0 bytes."""
        return self.max_bytes == 0 and all(n == 0 for _, _, n in self.partitions)


def _fetch_ask(node: int, version: int, body: memoryview) -> FetchAsk:
    value, _ = entity_reader(load_request_schema(_FETCH, version))(body, 0)
    return FetchAsk(
        node, version, value.session_epoch, value.min_bytes, value.max_bytes,
        tuple((t.topic_id.bytes if version >= 13 else t.topic, p.partition,
               p.partition_max_bytes) for t in value.topics for p in t.partitions))
BrokerPreferred = Callable[[str, str, int], "int | None"]


def _default_leaders(topic: str, partition: int) -> int:
    return [1, 3][partition % 2]


@cache
def _response_module(api_key: int, version: int) -> Any:
    return load_entity_module(api_key_map[api_key], version, EntityType.response)


def _field_names(value: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(value)}


def cap_api_versions(body: bytes, version: int, caps: dict[int, int]) -> bytes:
    """An ApiVersions response body with the ``max_version`` of the APIs in ``caps`` lowered
    (the proxy's own in-place edit, with these caps instead of the proxy's)."""
    return rewrite.cap_api_versions(
        body, version,
        lambda key, lo, hi: (lo, min(hi, caps[key])) if key in caps else (lo, hi))


class _Node:
    def __init__(self, node_id: int, rack: str) -> None:
        self.node_id = node_id
        self.rack = rack
        self.port = 0
        self.alive = True
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[_Connection] = set()


class _Connection:
    """One client connection to a forwarder and its upstream connection to the broker."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()
                writer.close()


class RackCluster:
    """Simulated brokers ``racks`` (node id -> rack) in front of the broker at ``upstream``.

    Every partition has all the nodes as replicas (in node id order); its leader is
    ``leaders(topic, partition)`` while that node is alive, else the first live replica.
    ``broker_preferred(client_rack, topic, partition)``, when given, is asked on the leader's
    Fetch v11+ responses and may name the replica the client should fetch from instead.
    """

    def __init__(
        self,
        upstream: str,
        racks: dict[int, str] | None = None,
        leaders: Leaders | None = None,
        broker_preferred: BrokerPreferred | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        racks = {1: "a", 2: "b", 3: "c"} if racks is None else racks
        self._nodes = {node_id: _Node(node_id, racks[node_id]) for node_id in sorted(racks)}
        self._replicas = tuple(sorted(racks))
        self._leaders = leaders or _default_leaders
        self._broker_preferred = broker_preferred
        self._max_frame = max_frame_bytes
        self._topic_names: dict[bytes, str] = {}  # topic id -> name, from Metadata responses
        self._lock = threading.Lock()
        self._fetch_response_bytes = dict.fromkeys(self._nodes, 0)
        self._fetch_requests = dict.fromkeys(self._nodes, 0)
        self._fetch_log: list[tuple[int, int]] = []  # (node id, bytes) of each Fetch response
        self._fetch_asks: list[FetchAsk] = []  # every Fetch v11+ request, as kio decodes it
        # the Fetch requests a preferred replica is picked for, read on their way in
        self._summaries: dict[int, FetchRequestSummary] = {}
        self._redirects = dict.fromkeys(self._nodes, 0)
        self._versions_used: dict[int, set[int]] = {}  # api key -> versions clients sent
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle (test thread) -------------------------------------------------------------

    def start(self) -> RackCluster:
        """Bind one listener per node (127.0.0.1, free ports) and serve them from a daemon
        thread. A ``RackCluster`` starts once."""
        if self._loop is not None or any(n.port for n in self._nodes.values()):
            raise RuntimeError("a RackCluster starts once")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="rack-cluster", daemon=True)
        self._thread.start()
        try:
            self._call(self._start_servers())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = None
        self._thread = None
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> RackCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop_node(self, node_id: int) -> None:
        """Node ``node_id`` goes away like a dead broker: its listener closes, its connections
        (both sides) are aborted, and the other nodes' Metadata and DescribeCluster answers no
        longer list it as a broker nor in any ISR; partitions it led move to a live replica."""
        if node_id not in self._nodes:
            raise KeyError(f"no node {node_id}")
        self._call(self._stop_node(node_id))

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("not started")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    # -- addresses and state -----------------------------------------------------------------

    @property
    def node_ids(self) -> tuple[int, ...]:
        return self._replicas

    def port(self, node_id: int) -> int:
        return self._nodes[node_id].port

    def address(self, node_id: int) -> str:
        return f"{HOST}:{self.port(node_id)}"

    @property
    def bootstrap(self) -> str:
        return self.address(self._replicas[0])

    def rack(self, node_id: int) -> str:
        return self._nodes[node_id].rack

    def live_nodes(self) -> tuple[int, ...]:
        return tuple(n for n in self._replicas if self._nodes[n].alive)

    def leader(self, topic: str, partition: int) -> int:
        """The leader the cluster advertises for ``topic``/``partition`` right now."""
        live = self.live_nodes()
        preferred = self._leaders(topic, partition)
        if preferred in live:
            return preferred
        return live[0] if live else -1

    # -- accounting (read from the test thread) ----------------------------------------------

    @property
    def fetch_response_bytes(self) -> dict[int, int]:
        """Node id -> bytes of Fetch responses (with size prefix) it forwarded to clients."""
        with self._lock:
            return dict(self._fetch_response_bytes)

    def fetch_log(self) -> list[tuple[int, int]]:
        """(node id, bytes) of every Fetch response served, in order."""
        with self._lock:
            return list(self._fetch_log)

    def fetch_asks(self) -> list[FetchAsk]:
        """What every Fetch v11+ request asked for, in order."""
        with self._lock:
            return list(self._fetch_asks)

    @property
    def fetch_requests(self) -> dict[int, int]:
        """Node id -> Fetch requests it received from clients."""
        with self._lock:
            return dict(self._fetch_requests)

    @property
    def redirects(self) -> dict[int, int]:
        """Node id -> partitions it redirected with ``preferred_read_replica``."""
        with self._lock:
            return dict(self._redirects)

    def versions_used(self) -> dict[int, list[int]]:
        """API key -> the versions clients sent requests with, sorted."""
        with self._lock:
            return {k: sorted(v) for k, v in sorted(self._versions_used.items())}

    def topic_names(self) -> dict[bytes, str]:
        """Topic id (16 bytes) -> name, as learnt from Metadata responses."""
        with self._lock:
            return dict(self._topic_names)

    # -- the loop side -----------------------------------------------------------------------

    async def _start_servers(self) -> None:
        for node in self._nodes.values():

            async def handle(
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                node: _Node = node,
            ) -> None:
                await self._serve(node, reader, writer)

            node.server = await asyncio.start_server(handle, HOST, 0)
            node.port = int(node.server.sockets[0].getsockname()[1])

    async def _shut_node(self, node: _Node) -> None:
        server, node.server = node.server, None
        if server is not None:
            server.close()
        connections = list(node.connections)
        for conn in connections:
            conn.abort()
        tasks = [c.task for c in connections if c.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _stop_node(self, node_id: int) -> None:
        node = self._nodes[node_id]
        node.alive = False
        await self._shut_node(node)

    async def _close_all(self) -> None:
        for node in self._nodes.values():
            node.alive = False
            await self._shut_node(node)

    async def _serve(
        self, node: _Node, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = _Connection(writer)
        conn.task = asyncio.current_task()  # type: ignore[assignment]
        if not node.alive:
            conn.abort()
            return
        node.connections.add(conn)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            conn.upstream = up_writer
            if not node.alive:  # stopped while connecting
                return
            table = CorrelationTable()
            responses = ResponseStream(
                table,
                lambda entry, frame: self._rewrite(node, entry, frame),
                self._max_frame,
                announce=True,
            )
            pumps = [
                asyncio.ensure_future(self._pump_requests(node, reader, up_writer, table)),
                asyncio.ensure_future(self._pump_responses(node, up_reader, writer, responses)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except Exception:  # never let a connection's failure escape into the loop
            pass
        finally:
            node.connections.discard(conn)
            conn.abort()

    async def _pump_requests(
        self,
        node: _Node,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        table: CorrelationTable,
    ) -> None:
        """Client -> broker, one whole request frame at a time (requests are small)."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                prefix = await reader.readexactly(4)
                size = INT32.unpack(prefix)[0]
                if size < 10 or size > self._max_frame:
                    return
                frame = await reader.readexactly(size)
                header = parse_request_header(frame, 0, size)
                api_key, version = header.api_key, header.api_version
                with self._lock:
                    self._versions_used.setdefault(api_key, set()).add(version)
                expects_response = True
                if api_key == _PRODUCE:
                    expects_response = produce_acks(frame, header.size, size, version) != 0
                entry = InFlight(
                    api_key,
                    version,
                    header.correlation_id,
                    header.client_id,
                    size + 4,
                    expects_response,
                )
                if api_key == _FETCH:
                    ask = None
                    if version >= 11:
                        with contextlib.suppress(Exception):
                            ask = _fetch_ask(node.node_id, version, memoryview(frame)[header.size:])
                    with self._lock:
                        self._fetch_requests[node.node_id] += 1
                        if ask is not None:
                            self._fetch_asks.append(ask)
                    if self._broker_preferred is not None and version >= 11:
                        with contextlib.suppress(Exception):
                            self._summaries[id(entry)] = parse_fetch_request(
                                frame, header.size, version)
                if expects_response:
                    table.add(entry)
                upstream.write(prefix + frame)
                await upstream.drain()

    async def _pump_responses(
        self,
        node: _Node,
        upstream: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        responses: ResponseStream,
    ) -> None:
        """Broker -> client through ``ResponseStream`` (which calls ``_rewrite``)."""
        with contextlib.suppress(ConnectionError):
            while True:
                data = await upstream.read(256 * 1024)
                if not data:
                    return
                segments, done = responses.feed(data, self._wants_whole_fetch)
                for segment in segments:
                    client.write(segment)
                sizes = [e.response_size for e in done if e.api_key == _FETCH]
                if sizes:
                    with self._lock:
                        self._fetch_response_bytes[node.node_id] += sum(sizes)
                        self._fetch_log.extend((node.node_id, n) for n in sizes)
                await client.drain()

    def _wants_whole_fetch(self, entry: InFlight) -> bool:
        return entry.api_key == _FETCH and id(entry) in self._summaries

    # -- response rewriting (on the loop) ----------------------------------------------------

    def _rewrite(self, node: _Node, entry: InFlight, frame: bytes | memoryview) -> bytes | None:
        api_key, version = entry.api_key, entry.api_version
        try:
            header = parse_response_header(
                frame, 0, len(frame), apis.response_header_version(api_key, version)
            )
            frame = bytes(frame)
            head, body = frame[: header.size], frame[header.size :]
            if api_key == _FETCH:
                return self._redirect_fetch(node, entry, frame, header.size)
            if api_key == _API_VERSIONS:
                error_code = INT16.unpack_from(body, 0)[0]
                v = 0 if error_code == _UNSUPPORTED_VERSION else version
                return head + cap_api_versions(body, v, VERSION_CAPS)
            if api_key == _METADATA:
                return head + encode_entity(self._metadata(decode_response(api_key, version, body)))
            if api_key == _FIND_COORDINATOR:
                value = decode_response(api_key, version, body)
                return head + encode_entity(self._find_coordinator(value))
            if api_key == _DESCRIBE_CLUSTER:
                value = decode_response(api_key, version, body)
                return head + encode_entity(self._describe_cluster(value, version))
        except Exception:
            return None  # what cannot be decoded passes unchanged
        return None

    def _metadata(self, value: Any) -> Any:
        live = self.live_nodes()
        dead = tuple(n for n in self._replicas if n not in live)
        broker_cls = _response_module(_METADATA, value.__version__).MetadataResponseBroker
        with_rack = "rack" in {f.name for f in dataclasses.fields(broker_cls)}
        brokers = []
        for n in live:
            fields: dict[str, Any] = {
                "node_id": BrokerId(n),
                "host": HOST,
                "port": i32(self._nodes[n].port),
            }
            if with_rack:
                fields["rack"] = self._nodes[n].rack
            brokers.append(broker_cls(**fields))
        changes: dict[str, Any] = {"brokers": tuple(brokers)}
        if "controller_id" in _field_names(value):
            changes["controller_id"] = BrokerId(live[0] if live else -1)
        topics = []
        for topic in value.topics:
            topic_id = getattr(topic, "topic_id", None)
            if topic.name and topic_id is not None and topic_id.int:
                with self._lock:
                    self._topic_names[topic_id.bytes] = topic.name
            if topic.error_code != 0 or not topic.name:
                topics.append(topic)
                continue
            partitions = []
            for p in topic.partitions:
                if p.error_code != 0:
                    partitions.append(p)
                    continue
                pchanges: dict[str, Any] = {
                    "leader_id": BrokerId(self.leader(topic.name, p.partition_index)),
                    "replica_nodes": tuple(BrokerId(n) for n in self._replicas),
                    "isr_nodes": tuple(BrokerId(n) for n in live),
                }
                if "offline_replicas" in _field_names(p):
                    pchanges["offline_replicas"] = tuple(BrokerId(n) for n in dead)
                partitions.append(dataclasses.replace(p, **pchanges))
            topics.append(dataclasses.replace(topic, partitions=tuple(partitions)))
        changes["topics"] = tuple(topics)
        return dataclasses.replace(value, **changes)

    def _coordinator(self) -> _Node | None:
        live = self.live_nodes()
        return self._nodes[live[0]] if live else None

    def _find_coordinator(self, value: Any) -> Any:
        node = self._coordinator()
        if node is None:
            return value
        address = {"node_id": BrokerId(node.node_id), "host": HOST, "port": i32(node.port)}
        if "coordinators" in _field_names(value):  # v4+: batched
            coordinators = tuple(
                dataclasses.replace(c, **address) if c.error_code == 0 else c
                for c in value.coordinators
            )
            return dataclasses.replace(value, coordinators=coordinators)
        if value.error_code != 0:
            return value
        return dataclasses.replace(value, **address)

    def _describe_cluster(self, value: Any, version: int) -> Any:
        live = self.live_nodes()
        broker_cls = _response_module(_DESCRIBE_CLUSTER, version).DescribeClusterBroker
        brokers = tuple(
            broker_cls(
                broker_id=BrokerId(n),
                host=HOST,
                port=i32(self._nodes[n].port),
                rack=self._nodes[n].rack,
            )
            for n in live
        )
        return dataclasses.replace(
            value, brokers=brokers, controller_id=BrokerId(live[0] if live else -1)
        )

    def _redirect_fetch(
        self, node: _Node, entry: InFlight, frame: bytes, header_size: int
    ) -> bytes | None:
        summary = self._summaries.pop(id(entry), None)
        preferred = self._broker_preferred
        if not isinstance(summary, FetchRequestSummary) or preferred is None:
            return None
        rack = summary.rack_id
        live = self.live_nodes()

        def choose(topic: str | bytes, partition: int, current: int) -> int | None:
            if isinstance(topic, str):
                name: str | None = topic
            else:
                with self._lock:
                    name = self._topic_names.get(bytes(topic))
            if name is None or self.leader(name, partition) != node.node_id:
                return None
            target = preferred(rack, name, partition)
            if target is None or target == node.node_id or target not in live:
                return None
            return target

        new, redirects = set_preferred_read_replicas(frame, header_size, entry.api_version, choose)
        if new is None:
            return None
        entry.response_size = len(new) + 4
        with self._lock:
            self._redirects[node.node_id] += len(redirects)
        return new


__all__ = ["VERSION_CAPS", "FetchAsk", "RackCluster", "cap_api_versions"]
