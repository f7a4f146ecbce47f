"""YAML configuration, validated with pydantic; errors name the field path and file line.

The configuration is built once and frozen. Unknown keys, duplicate keys and wrong types are
errors; every error message reads ``FILE:LINE:COLUMN: field.path: what is wrong``.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from quota.entities import DEFAULT, DEFAULT_NAME, EntityKey, Name, QuotaType
from quota.manager import QuotaSettings
from quota.replay import settings_from_section
from quota.storage import Limit, LimitType, StoragePolicy
from quota.storage import State as StorageState
from routing.client_rack import ClientRacks, RackRule
from routing.selector import LeaderSelector, RackAwareSelector, ReplicaSelector

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @classmethod
    def parse(cls, value: Any) -> HostPort:
        if isinstance(value, HostPort):
            return value
        if not isinstance(value, str):
            raise ValueError('expected a "host:port" string')
        host, sep, port_s = value.strip().rpartition(":")
        if not sep or not host or not port_s.isdigit():
            raise ValueError(f'expected "host:port", got {value!r}')
        host = host.strip("[]")  # allow [::1]:9092
        port = int(port_s)
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is outside 1-65535")
        return cls(host, port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PortRange:
    first: int
    last: int

    @classmethod
    def parse(cls, value: Any) -> PortRange:
        if isinstance(value, PortRange):
            return value
        text = str(value).strip()
        first_s, sep, last_s = text.partition("-")
        if not sep:
            first_s = last_s = text
        if not (first_s.strip().isdigit() and last_s.strip().isdigit()):
            raise ValueError(f'expected a port range like "9193-9292", got {value!r}')
        first, last = int(first_s), int(last_s)
        if not (0 < first <= last < 65536):
            raise ValueError(f"port range {first}-{last} must satisfy 1 <= first <= last <= 65535")
        return cls(first, last)

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class ListenersConfig(_Model):
    bootstrap: HostPort = Field(description="Where clients bootstrap (host:port the proxy binds).")
    advertised_host: str = Field(
        min_length=1, description="Host written into every rewritten broker address."
    )
    broker_ports: PortRange = Field(
        description="One proxy port per upstream broker, e.g. 9193-9292."
    )
    broker_listen_host: str | None = Field(
        default=None,
        description="Address the per-broker listeners bind; defaults to the bootstrap host.",
    )

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _parse_bootstrap(cls, value: Any) -> HostPort:
        return HostPort.parse(value)

    @field_validator("broker_ports", mode="before")
    @classmethod
    def _parse_ports(cls, value: Any) -> PortRange:
        return PortRange.parse(value)

    @property
    def broker_host(self) -> str:
        return self.broker_listen_host or self.bootstrap.host


class UpstreamConfig(_Model):
    bootstrap_servers: Annotated[list[HostPort], Field(min_length=1)]
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    metadata_refresh_seconds: float = Field(
        default=30.0, gt=0, description="How often the proxy itself refreshes the broker list."
    )

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _parse_servers(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ValueError('expected a list of "host:port" strings')
        return [HostPort.parse(v) for v in value]


class MetricsConfig(_Model):
    listen: HostPort | None = None

    @field_validator("listen", mode="before")
    @classmethod
    def _parse_listen(cls, value: Any) -> HostPort | None:
        return None if value is None else HostPort.parse(value)


class LoggingConfig(_Model):
    format: Literal["json", "console"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


class NetworkConfig(_Model):
    max_frame_bytes: int = Field(
        default=DEFAULT_MAX_FRAME_BYTES,
        gt=0,
        le=2**31 - 1,
        description="Largest frame accepted in either direction (Kafka: socket.request.max.bytes).",
    )
    write_buffer_high_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    write_buffer_low_bytes: int = Field(default=1024 * 1024, ge=0)
    shutdown_timeout_seconds: float = Field(default=30.0, ge=0)
    max_in_flight_requests: int = Field(
        default=1000, ge=1, le=1_000_000,
        description="Requests of one connection awaiting their response before the proxy "
        "reads no more from it (a Kafka broker reads one at a time).")
    max_connections: int | None = Field(
        default=None, ge=1,
        description="Client connections at once; more are refused at accept. Default: what "
        "the file-descriptor limit allows (two each: client and upstream), less a reserve.")
    request_header_timeout_seconds: float = Field(
        default=10.0, gt=0,
        description="From a request's first byte until its header is read.")
    request_read_timeout_seconds: float = Field(
        default=120.0, gt=0,
        description="From a request's first byte until its last.")
    connections_max_idle_seconds: float = Field(
        default=600.0, ge=0,
        description="Kafka connections.max.idle.ms: close a connection with nothing in "
        "flight and no bytes either way for this long (0: never).")

    @model_validator(mode="after")
    def _low_below_high(self) -> NetworkConfig:
        if self.write_buffer_low_bytes > self.write_buffer_high_bytes:
            raise ValueError("write_buffer_low_bytes must not exceed write_buffer_high_bytes")
        return self


class QuotaWindowConfig(_Model):
    samples: int = Field(default=11, ge=1, le=1000, description="Kafka quota.window.num")
    size_seconds: int = Field(
        default=1, ge=1, le=3600, description="Kafka quota.window.size.seconds"
    )


class QuotaEntityConfig(_Model):
    """One quota entity: ``user``, ``client-id`` or both (``"<default>"`` = the default
    entity), and at least one quota."""

    user: str | None = None
    client_id: str | None = Field(
        default=None, validation_alias=AliasChoices("client-id", "client_id")
    )
    producer_byte_rate: int | None = Field(default=None, gt=0)
    consumer_byte_rate: int | None = Field(default=None, gt=0)
    request_percentage: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _complete(self) -> QuotaEntityConfig:
        if self.user is None and self.client_id is None:
            raise ValueError("an entity names a user, a client-id, or both")
        if not self.quotas():
            raise ValueError(
                "set at least one of producer_byte_rate, consumer_byte_rate, request_percentage"
            )
        return self

    def key(self) -> EntityKey:
        def name(value: str | None) -> Name | None:
            return DEFAULT if value == DEFAULT_NAME else value

        return EntityKey(name(self.user), name(self.client_id))

    def quotas(self) -> dict[QuotaType, float]:
        return {
            qt: float(v) for qt in QuotaType if (v := getattr(self, qt.value)) is not None
        }


class QuotasConfig(_Model):
    window: QuotaWindowConfig = QuotaWindowConfig()
    cap_byte_rate_throttle: bool = Field(
        default=False,
        description="Bound byte-rate throttles at one window, like request-time throttles "
        "(Kafka leaves them unbounded).",
    )
    entities: list[QuotaEntityConfig] = []
    metrics_top_entities: int = Field(
        default=100, ge=0, le=10_000,
        description="Per-entity quota metrics are exported for this many busiest budgets.",
    )
    watch_seconds: float = Field(
        default=2.0, ge=0,
        description="How often the config file is checked for changes (0: only on SIGHUP).",
    )

    def settings(self) -> QuotaSettings:
        """The same conversion the replay applies to the ``quotas-*.json`` next to a
        capture, so the two cannot drift apart."""
        return settings_from_section(self.model_dump(exclude_none=True))


class RackClientRule(_Model):
    """Clients that send no rack: a regular expression on the client-id (matched from its
    start), a source network, or both; the first matching rule gives the rack."""

    client_id: str | None = Field(
        default=None, validation_alias=AliasChoices("client-id", "client_id")
    )
    network: str | None = None
    rack: str = Field(min_length=1)

    @field_validator("client_id")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("network")
    @classmethod
    def _network(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError as exc:
                raise ValueError(f"not a network: {exc}") from None
        return value

    @model_validator(mode="after")
    def _some_condition(self) -> RackClientRule:
        if self.client_id is None and self.network is None:
            raise ValueError("a rule names a client_id pattern, a network, or both")
        return self

    def rule(self) -> RackRule:
        return RackRule(
            self.rack,
            re.compile(self.client_id) if self.client_id is not None else None,
            ipaddress.ip_network(self.network, strict=False) if self.network else None,
        )


SELECTORS = ("leader", "rack-aware")


class RacksConfig(_Model):
    """Rack-aware fetch routing (KIP-392). Present: consumers are pointed at an in-sync
    replica in their own rack; absent: the proxy leaves replica selection to the brokers."""

    proxy_rack: str | None = Field(
        default=None, min_length=1,
        description="The rack of this proxy: the rack of clients nothing else places.")
    selector: str = Field(
        default="rack-aware",
        description='"leader" (off), "rack-aware", or "module:Class" with a select method.')
    spread: bool = Field(
        default=False,
        description="rack-aware: spread clients and partitions over equal candidates "
        "instead of Kafka's highest-node-id tie-break.")
    decide: Literal["broker", "proxy"] = Field(
        default="broker",
        description="When the broker itself sets preferred_read_replica: keep its choice "
        "(broker) or replace it (proxy).")
    brokers: dict[int, str] = Field(
        default_factory=dict, description="Racks of brokers that advertise none (node id: rack).")
    clients: list[RackClientRule] = []

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        if value in SELECTORS:
            return value
        load_selector(value)  # raises ValueError naming what is wrong
        return value

    def make_selector(self) -> ReplicaSelector:
        if self.selector == "leader":
            return LeaderSelector()
        if self.selector == "rack-aware":
            return RackAwareSelector(spread=self.spread)
        return load_selector(self.selector)

    def client_racks(self) -> ClientRacks:
        return ClientRacks([c.rule() for c in self.clients], self.proxy_rack)


def load_selector(spec: str) -> ReplicaSelector:
    """Instantiate a user-supplied selector from ``module:Class``."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(
            f'expected "leader", "rack-aware" or "module:Class", got {spec!r}')
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no {class_name!r}")
    try:
        selector = cls()
    except Exception as exc:
        raise ValueError(f"{spec}() failed: {exc}") from None
    if not callable(getattr(selector, "select", None)):
        raise ValueError(f"{spec} has no select(client, partition) method")
    return cast(ReplicaSelector, selector)


class CaptureConfig(_Model):
    """Traffic capture: one Parquet record per request (never payloads)."""

    dir: str = Field(min_length=1, description="Directory of the capture files (created).")
    rotate_mb: float = Field(default=128, gt=0, description="Start a new file past this size.")
    rotate_seconds: float = Field(default=300, gt=0,
                                  description="Start a new file after this long.")
    batch_records: int = Field(default=1024, ge=1, le=1_000_000,
                               description="Records handed to the writer thread at a time.")
    queue_batches: int = Field(default=64, ge=1, le=100_000,
                               description="Batches that may wait for the writer; beyond, "
                               "records are dropped and counted.")


class LimitConfig(_Model):
    """A volume limit (seed 004)."""

    type: Literal["ConsumedSpace", "MinFreeBytes", "MinFreePercentage"]
    level: float = Field(ge=0, description="Bytes, or percent for MinFreePercentage.")

    @model_validator(mode="after")
    def _percentage(self) -> LimitConfig:
        if self.type == "MinFreePercentage" and self.level > 100:
            raise ValueError("a MinFreePercentage level is at most 100")
        return self

    def limit(self) -> Limit:
        return Limit(LimitType(self.type), self.level)


class VolumeLimitsConfig(_Model):
    soft: LimitConfig | None = None
    hard: LimitConfig | None = None


class VolumeAgentConfig(_Model):
    """``kafka-quota-proxy volume-agent``: publishes one broker's volume usage."""

    broker_id: int = Field(ge=0, description="The broker this agent runs beside.")
    log_dirs: Annotated[list[str], Field(min_length=1)]
    interval_seconds: float = Field(default=30.0, gt=0)
    bootstrap_servers: list[HostPort] | None = None  # default: upstream.bootstrap_servers
    client_id: str = Field(default="volume-agent", min_length=1)
    # Per volume (its name as published: the mount point), limits overriding soft/hard.
    volume_limits: dict[str, VolumeLimitsConfig] = {}
    metrics: HostPort | None = None

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _parse_servers(cls, value: Any) -> Any:
        return None if value is None else UpstreamConfig._parse_servers(value)

    @field_validator("metrics", mode="before")
    @classmethod
    def _parse_listen(cls, value: Any) -> HostPort | None:
        return None if value is None else HostPort.parse(value)


class StorageConfig(_Model):
    """Storage-aware throttling: producers slow down, then pause, before a volume fills."""

    topic: str = Field(default="__kafka_quota_proxy_volumes", min_length=1)
    stale_after_seconds: float = Field(default=120.0, gt=0)
    on_missing: Literal["PAUSE", "OPEN"] = "PAUSE"
    soft: LimitConfig | None = None
    hard: LimitConfig
    unquoted_producer_byte_rate: float = Field(default=52428800, gt=0)
    exempt_users: list[str] = []
    exempt_client_ids: list[str] = []
    pause_throttle_ms: int = Field(default=1000, ge=1, le=300_000)
    evaluate_seconds: float = Field(default=1.0, gt=0, le=60)
    agent: VolumeAgentConfig | None = None

    def policy(self) -> StoragePolicy:
        return StoragePolicy(
            self.soft.limit() if self.soft is not None else None, self.hard.limit(),
            int(self.stale_after_seconds * 1000), StorageState(self.on_missing))


class ProxyConfig(_Model):
    listeners: ListenersConfig
    upstream: UpstreamConfig
    metrics: MetricsConfig = MetricsConfig()
    logging: LoggingConfig = LoggingConfig()
    network: NetworkConfig = NetworkConfig()
    quotas: QuotasConfig = QuotasConfig()
    racks: RacksConfig | None = None
    capture: CaptureConfig | None = None
    storage: StorageConfig | None = None


class AgentFile(_Model):
    """What ``volume-agent`` reads: the ``storage`` section (with ``agent``) of a config file;
    the proxy's other sections may be there too."""

    storage: StorageConfig
    upstream: UpstreamConfig | None = None
    logging: LoggingConfig = LoggingConfig()
    listeners: Any = None
    metrics: Any = None
    network: Any = None
    quotas: Any = None
    racks: Any = None
    capture: Any = None

    @model_validator(mode="after")
    def _agent(self) -> AgentFile:
        if self.storage.agent is None:
            raise ValueError("storage.agent is required for the volume agent")
        if self.storage.agent.bootstrap_servers is None and self.upstream is None:
            raise ValueError("storage.agent.bootstrap_servers or upstream is required")
        return self


class QuotasFile(_Model):
    """What ``quotas resolve|simulate`` read from a file holding nothing but a ``quotas``
    section: an operator trying a quota change needs no listeners or upstream."""

    quotas: QuotasConfig


_WILDCARDS = {"", "0.0.0.0", "::", "*"}


def _addresses(host: str) -> set[str]:
    if host == "localhost":
        return {"127.0.0.1", "::1"}
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        return {host}


def _may_collide(a: str, b: str) -> bool:
    """Whether two listen hosts can clash on the same port: the same address, either one a
    wildcard, or ``localhost`` and a loopback address. Distinct addresses do not clash."""
    if a in _WILDCARDS or b in _WILDCARDS:
        return True
    return bool(_addresses(a) & _addresses(b))


def cross_checks(config: ProxyConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks across fields, each reported at the field that has to change."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    listeners = config.listeners
    if listeners.bootstrap.port in listeners.broker_ports and _may_collide(
        listeners.bootstrap.host, listeners.broker_host
    ):
        problems.append(
            (
                ("listeners", "broker_ports"),
                f"bootstrap port {listeners.bootstrap.port} lies inside broker_ports "
                f"{listeners.broker_ports}",
            )
        )
    listen = config.metrics.listen
    if listen is not None and (
        (listen.port in listeners.broker_ports and _may_collide(listen.host, listeners.broker_host))
        or (
            listen.port == listeners.bootstrap.port
            and _may_collide(listen.host, listeners.bootstrap.host)
        )
    ):
        problems.append(
            (
                ("metrics", "listen"),
                f"metrics.listen port {listen.port} collides with a proxy listener",
            )
        )
    problems.extend(quota_checks(config.quotas))
    return problems


def quota_checks(quotas: QuotasConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks across the ``quotas`` section: each entity is configured once."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    seen: dict[EntityKey, int] = {}
    for i, entity in enumerate(quotas.entities):
        key = entity.key()
        if key in seen:
            problems.append(
                (
                    ("quotas", "entities", i),
                    f"entity {key.path} is already configured at quotas.entities.{seen[key]}",
                )
            )
        seen.setdefault(key, i)
    return problems


class ConfigError(Exception):
    """A configuration that cannot be used; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ---------------------------------------------------------------- YAML with positions


def _positions(
    node: yaml.Node,
    path: tuple[Any, ...],
    out: dict[tuple[Any, ...], yaml.Mark],
    errors: list[str],
    source: str,
) -> None:
    out.setdefault(path, node.start_mark)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                m = key_node.start_mark
                dotted = ".".join(str(p) for p in (*path, key))
                errors.append(f"{source}:{m.line + 1}:{m.column + 1}: {dotted}: duplicate key")
            seen.add(key)
            out[(*path, key)] = key_node.start_mark
            _positions(value_node, (*path, key), out, errors, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _positions(item, (*path, i), out, errors, source)


def _mark_for(loc: tuple[Any, ...], marks: dict[tuple[Any, ...], yaml.Mark]) -> yaml.Mark | None:
    loc = tuple(loc)
    while loc:
        if loc in marks:
            return marks[loc]
        loc = loc[:-1]
    return marks.get(())


# Bounds on a configuration file, so that a broken or hostile one costs little to refuse: its
# size, how deeply its collections nest, and how many nodes it holds once every alias is
# expanded (an alias bomb of a few hundred bytes otherwise expands to gigabytes as it is
# validated). Each is far beyond any real configuration.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 64
MAX_CONFIG_NODES = 200_000


class ConfigTooLarge(yaml.composer.ComposerError):
    """A file past one of the bounds above."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with ``MAX_CONFIG_DEPTH`` on nesting, checked as it composes
    (deep nesting would otherwise exhaust Python's stack)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise ConfigTooLarge(
                    None, None, f"collections nested deeper than {MAX_CONFIG_DEPTH} levels",
                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes ``root`` holds with every alias expanded (shared nodes counted each time
    they are referred to), without expanding anything: each node's size is computed once."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = ([n for pair in node.value for n in pair]
                    if isinstance(node, yaml.MappingNode) else list(node.value))
        if children_done:
            total = 1
            for child in children:
                total += sizes[id(child)]
                if total > MAX_CONFIG_NODES:
                    break
            sizes[id(node)] = total
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


_FLOW = re.compile(r"""[\[\]{}"'#\n]""")


def _flow_depth_exceeds(text: str, limit: int) -> int | None:
    """Where (an offset) brackets of flow collections (``[``, ``{``) nest deeper than
    ``limit``, skipping quoted strings and comments: a linear pre-check, so that deep nesting
    is refused before PyYAML's scanner spends its time on it (``_BoundedLoader`` checks the
    real nesting; this only finds it sooner). None when they do not."""
    depth = 0
    quote = ""
    comment = False
    for m in _FLOW.finditer(text):
        c = m.group()
        if comment:
            comment = c != "\n"
        elif quote:
            if c == quote:
                quote = ""
        elif c in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif c in "\"'":
            quote = c
        elif c == "#":
            comment = True
    return None


def _load_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for positions) and its data, within the bounds above."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigTooLarge(None, None, f"larger than {MAX_CONFIG_BYTES} bytes", None)
    deep = _flow_depth_exceeds(text, MAX_CONFIG_DEPTH)
    if deep is not None:
        line = text.count("\n", 0, deep)
        column = deep - (text.rfind("\n", 0, deep) + 1)
        raise ConfigTooLarge(None, None,
                             f"collections nested deeper than {MAX_CONFIG_DEPTH} levels",
                             yaml.Mark("<config>", deep, line, column, None, 0))
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        if _expanded_size(root) > MAX_CONFIG_NODES:
            raise ConfigTooLarge(
                None, None, f"more than {MAX_CONFIG_NODES} values once its aliases are "
                "expanded", root.start_mark)
        return root, loader.construct_document(root)
    finally:
        loader.dispose()


def parse_config(text: str, source: str = "<config>") -> ProxyConfig:
    """Parse and validate configuration text. Raises ``ConfigError`` with positioned messages."""
    return _parse(text, source, ProxyConfig)


_M = TypeVar("_M", bound=BaseModel)


def _parse(text: str, source: str, model: type[_M]) -> _M:
    errors: list[str] = []
    try:
        root, data = _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "refused" if isinstance(exc, ConfigTooLarge) else "YAML syntax error"
        raise ConfigError([f"{where}: {kind}: {problem}"]) from None
    marks: dict[tuple[Any, ...], yaml.Mark] = {}
    if root is not None:
        _positions(root, (), marks, errors, source)
    if errors:
        raise ConfigError(errors)
    if not isinstance(data, dict):
        raise ConfigError([f"{source}:1:1: the configuration must be a YAML mapping"])

    def report(loc: tuple[Any, ...], msg: str) -> None:
        mark = _mark_for(loc, marks)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        errors.append(f"{where}: {dotted}: {msg}")

    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(
                p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))
            )
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] == "missing":
                msg = "required field is missing"
            report(loc, msg)
        raise ConfigError(errors) from None
    if isinstance(config, ProxyConfig):
        for loc, msg in cross_checks(config):
            report(loc, msg)
    elif isinstance(config, QuotasFile):
        for loc, msg in quota_checks(config.quotas):
            report(loc, msg)
    if errors:
        raise ConfigError(errors)
    return config


def load_config(path: str | Path) -> ProxyConfig:
    return _load(path, ProxyConfig)


def load_agent_config(path: str | Path) -> AgentFile:
    return _load(path, AgentFile)


def parse_quotas(text: str, source: str = "<config>") -> QuotasConfig:
    """The ``quotas`` section for the what-if tools. A file with nothing but ``quotas:`` is
    validated alone; a file with other sections is validated as a full proxy configuration
    (so its errors are still reported). Raises ``ConfigError`` with positioned messages."""
    try:
        data = _load_yaml(text)[1]
    except yaml.YAMLError:
        return _parse(text, source, ProxyConfig).quotas  # reports the positioned syntax error
    if data is None or data == {}:
        raise ConfigError([
            f"{source}: the file is empty: expected a quotas: section, alone or in a full "
            "proxy configuration"])
    if isinstance(data, dict) and set(data) == {"quotas"}:
        return _parse(text, source, QuotasFile).quotas
    return _parse(text, source, ProxyConfig).quotas


def load_quotas_config(path: str | Path) -> QuotasConfig:
    """``parse_quotas`` of a file: a quota-only file or a full proxy configuration."""
    p = Path(path)
    return parse_quotas(_read(p), str(p))


def _load(path: str | Path, model: type[_M]) -> _M:
    p = Path(path)
    return _parse(_read(p), str(p), model)


def _read(p: Path) -> str:
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError([f"{p}: larger than {MAX_CONFIG_BYTES} bytes"])
        return raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{p}: cannot read: not UTF-8 text (byte {exc.start}: {exc.reason})"]
        ) from None


def summarize(config: ProxyConfig) -> str:
    lines = [
        f"bootstrap listener : {config.listeners.bootstrap}",
        f"advertised host    : {config.listeners.advertised_host}",
        f"broker ports       : {config.listeners.broker_ports} "
        f"({len(config.listeners.broker_ports)} brokers max)",
        f"upstream bootstrap : {', '.join(str(s) for s in config.upstream.bootstrap_servers)}",
        f"metrics            : {config.metrics.listen or 'off'}",
        f"max frame bytes    : {config.network.max_frame_bytes}",
        f"quota entities     : {len(config.quotas.entities)} "
        f"(window {config.quotas.window.samples} x {config.quotas.window.size_seconds} s)",
        "fetch routing      : "
        + (f"{config.racks.selector} (proxy rack {config.racks.proxy_rack or 'unset'}, "
           f"{len(config.racks.clients)} client rules)" if config.racks else "off"),
    ]
    return "\n".join(lines)
