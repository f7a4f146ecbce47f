"""The configuration's schema: pydantic models of every section, frozen once built.

Unknown keys and wrong types are errors (``extra="forbid"``); values are checked where they
are declared. Checks across fields are in ``config.checks``, reading files in ``config.loading``.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kafka_quota_proxy.config.acls import AclsConfig
from kafka_quota_proxy.config.security import ClientTlsConfig, ListenerSecurity, UpstreamSaslConfig
from kafka_quota_proxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kafka_quota_proxy.quota.client_quotas import (
    CONNECTION_CREATION_RATE,
    CONTROLLER_MUTATION_RATE,
    IP,
    Entity,
    entity_key,
    from_entity_key,
)
from kafka_quota_proxy.quota.entities import DEFAULT, DEFAULT_NAME, EntityKey, Name, QuotaType
from kafka_quota_proxy.quota.manager import QuotaSettings
from kafka_quota_proxy.quota.replay import settings_from_section
from kafka_quota_proxy.quota.request_time import DEFAULT_BASE_US, DEFAULT_PER_KIB_US
from kafka_quota_proxy.quota.storage import Limit, LimitType, StoragePolicy
from kafka_quota_proxy.quota.storage import State as StorageState
from kafka_quota_proxy.routing.client_rack import ClientRacks, RackRule
from kafka_quota_proxy.routing.selector import LeaderSelector, RackAwareSelector, ReplicaSelector


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


class ListenerKindConfig(_Model):
    """One kind of client listener, as in Kafka's listener map: its bootstrap port, one port
    per upstream broker, and how clients reach it (``security``). Clients of a kind are told
    about the brokers' ports of that kind."""

    bootstrap: HostPort = Field(description="Where clients bootstrap (host:port the proxy binds).")
    advertised_host: str | None = Field(
        default=None, min_length=1,
        description="Host written into every rewritten broker address.")
    broker_ports: PortRange = Field(
        description="One proxy port per upstream broker, e.g. 9193-9292."
    )
    broker_listen_host: str | None = Field(
        default=None,
        description="Address the per-broker listeners bind; defaults to the bootstrap host.",
    )
    security: ListenerSecurity = Field(
        default=ListenerSecurity(),
        description="TLS, principals and PROXY protocol of this kind's listeners.")
    max_connection_creation_rate: int | None = Field(
        default=None, gt=0, le=2147483647,
        description="Kafka listener.name.<l>.max.connection.creation.rate: connections per "
        "second each of this kind's listeners accepts; the excess is served late (KIP-612). "
        "Default: no limit.")

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


class ExtraListenerConfig(ListenerKindConfig):
    """A further kind of listener (``listeners.extra``), named in logs and metrics."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,31}$",
                      description="The kind's name, as Kafka names listeners (e.g. SSL, "
                      "INTERNAL); prefixes its listeners' names in logs.")


class ListenersConfig(ListenerKindConfig):
    """The client listeners: one kind (the common case), and optionally more (``extra``)."""

    advertised_host: str = Field(
        min_length=1, description="Host written into every rewritten broker address."
    )
    extra: list[ExtraListenerConfig] = Field(
        default=[], description="More kinds of listeners at once (Kafka's listener map), each "
        "with its own bootstrap, broker ports and security.")

    def kinds(self) -> list[tuple[str | None, ListenerKindConfig]]:
        """Every kind: (None, the main one), then (name, each extra one)."""
        return [(None, self), *((k.name, k) for k in self.extra)]

    def advertised(self, kind: ListenerKindConfig) -> str:
        return kind.advertised_host or self.advertised_host


class UpstreamConfig(_Model):
    bootstrap_servers: Annotated[list[HostPort], Field(min_length=1)]
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    metadata_refresh_seconds: float = Field(
        default=30.0, gt=0, description="How often the proxy itself refreshes the broker list."
    )
    tls: ClientTlsConfig | None = Field(
        default=None, description="TLS toward the brokers (default: plaintext).")
    sasl: UpstreamSaslConfig | None = Field(
        default=None, description="The proxy's own SASL identity for its own connections to "
        "brokers that require SASL.")

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
    splice: bool = Field(
        default=True,
        description="Move the record batches of Produce requests and Fetch responses from "
        "one socket to the other in the kernel (Linux splice) where nothing needs to read "
        "them: plaintext on both sides only. Off: every byte is read into the proxy and "
        "written out again.")
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
    max_connections_per_ip: int = Field(
        default=2147483647, ge=0, le=2147483647,
        description="Kafka max.connections.per.ip: connections one client address may hold "
        "at once (the PROXY header's source on listeners that take one); a new one past it "
        "is refused at once. Default: no limit.")
    max_connections_per_ip_overrides: dict[str, Annotated[int, Field(ge=0, le=2147483647)]] = (
        Field(default={}, description="Kafka max.connections.per.ip.overrides: address -> "
              "its own limit (a mapping, or Kafka's \"ip:count,ip:count\")."))

    @field_validator("max_connections_per_ip_overrides", mode="before")
    @classmethod
    def _overrides(cls, value: Any) -> Any:
        if isinstance(value, str):  # Kafka's form: "ip:count,ip:count"
            pairs = {}
            for item in (v.strip() for v in value.split(",")):
                if not item:
                    continue
                ip, sep, count = item.rpartition(":")
                if not sep or not count.strip().isdigit():
                    raise ValueError(f'expected "ip:count", got {item!r}')
                pairs[ip.strip().strip("[]")] = int(count)
            value = pairs
        if isinstance(value, dict):
            for ip in value:
                try:
                    ipaddress.ip_address(str(ip))
                except ValueError:
                    raise ValueError(f"{ip!r} is not an IP address (an IPv4 or IPv6 literal; "
                                     "host names are not resolved)") from None
        return value

    @model_validator(mode="after")
    def _low_below_high(self) -> NetworkConfig:
        if self.write_buffer_low_bytes > self.write_buffer_high_bytes:
            raise ValueError("write_buffer_low_bytes must not exceed write_buffer_high_bytes")
        if self.max_connections_per_ip == 0 and not self.max_connections_per_ip_overrides:
            raise ValueError("max_connections_per_ip 0 refuses every client: it needs "
                             "max_connections_per_ip_overrides (as in Kafka)")
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
    controller_mutation_rate: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="Partitions created, added or deleted per second (KIP-599), counted by "
        "Kafka's token bucket over quotas.controller_mutation_window.")

    @model_validator(mode="after")
    def _complete(self) -> QuotaEntityConfig:
        if self.user is None and self.client_id is None:
            raise ValueError("an entity names a user, a client-id, or both")
        if not self.quotas() and self.controller_mutation_rate is None:
            raise ValueError(
                "set at least one of producer_byte_rate, consumer_byte_rate, "
                "request_percentage, controller_mutation_rate"
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


class RequestTimeConfig(_Model):
    """What a request costs a request quota: the proxy's own time on it plus this estimate of
    the broker's thread time (``quota.request_time``); never the time it waits."""

    base_us: float = Field(
        default=DEFAULT_BASE_US, ge=0, le=1_000_000,
        description="Broker thread time charged per request (microseconds).",
    )
    per_kib_us: float = Field(
        default=DEFAULT_PER_KIB_US, ge=0, le=1_000_000,
        description="Broker thread time charged per KiB of request and response (microseconds).",
    )


_DOUBLE_KEYS = frozenset({QuotaType.REQUEST.value, CONTROLLER_MUTATION_RATE})


def _config_name(name: Name | None) -> str | None:
    return None if name is None else (name if isinstance(name, str) else DEFAULT_NAME)


def _principal(name: str) -> str:
    """A principal as ``Client.user`` holds it: Kafka's ``User:`` prefix is optional."""
    return name[5:] if name.startswith("User:") else name


class IpQuotaEntityConfig(_Model):
    """An ``ip`` quota entity (KIP-612): a client address, or ``"<default>"`` for every address
    without an entity of its own, and the connections per second it may open."""

    ip: str = Field(description='An IPv4 or IPv6 address, or "<default>".')
    connection_creation_rate: int = Field(
        gt=0, le=2147483647,
        description="New connections per second from the address, per listener scope "
        "(bootstrap, each broker); 2147483647 is Kafka's default: no limit.")

    @field_validator("ip")
    @classmethod
    def _address(cls, value: str) -> str:
        if value != DEFAULT_NAME:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f'{value!r} is not an IP address (an IPv4 or IPv6 literal, '
                                 'or "<default>"; host names are not resolved)') from None
        return value

    def entity(self) -> Entity:
        return ((IP, None if self.ip == DEFAULT_NAME else self.ip),)


class QuotaOverridesConfig(_Model):
    """Client quotas altered with Kafka's AlterClientQuotas (``kafka-configs.sh --alter``),
    stored as dynamic overrides of ``quotas.entities`` in a compacted topic on the cluster
    that every proxy reads (``docs/quota-admin.md``)."""

    enabled: bool = Field(
        default=True, description="Read (and, for admin principals, write) the overrides topic.")
    topic: str = Field(default="__kafka_quota_proxy_quotas", min_length=1, max_length=249)
    create_topic: bool = Field(
        default=True, description="Create the topic (compacted) when an alter needs it.")


class ShadowEntityConfig(QuotaEntityConfig):
    """A shadow quota entity: as ``quotas.entities``' without ``controller_mutation_rate``."""

    @field_validator("controller_mutation_rate")
    @classmethod
    def _not_evaluated(cls, value: float | None) -> float | None:
        if value is not None:
            raise ValueError("the shadow evaluates producer_byte_rate, consumer_byte_rate and "
                             "request_percentage only (a refused topic mutation has no "
                             "throttle to report)")
        return value

    @model_validator(mode="after")
    def _complete(self) -> ShadowEntityConfig:  # (replaces the live entities' check)
        if self.user is None and self.client_id is None:
            raise ValueError("an entity names a user, a client-id, or both")
        if not self.quotas():
            raise ValueError("set at least one of producer_byte_rate, consumer_byte_rate, "
                             "request_percentage")
        return self


Pacing = Literal["kafka", "strict"]
# ``quotas.pacing`` and ``quotas.shadow.pacing``
PACING: Any = Field(
    default="kafka",
    description="kafka: Kafka's sampled-rate throttle, exactly as a broker computes it. "
    "strict: producer_byte_rate and consumer_byte_rate budgets are paced (the first window's "
    "burst as Kafka allows it, then the quota whatever the batch or fetch size; README, "
    "\"Strict pacing\"). Reloadable.")


class ShadowQuotasConfig(_Model):
    """A candidate quota config evaluated beside the live one on the same traffic, with no
    effect on clients (``docs/shadow-quotas.md``): its budgets record what the live budgets
    record and export the throttles they would have imposed. Present and ``enabled``: on;
    absent or ``enabled: false``: off. Applied by a reload like the live quotas."""

    enabled: bool = Field(
        default=True, description="Evaluate the candidate (false: keep the section, switched "
        "off).")
    window: QuotaWindowConfig = QuotaWindowConfig()
    cap_byte_rate_throttle: bool = Field(
        default=False,
        description="Bound byte-rate throttles at one window, like request-time throttles.")
    pacing: Pacing = PACING
    entities: list[ShadowEntityConfig] = []
    # the live quotas' keys a shadow refuses, each with its reason (``_live_only``)
    request_time: Any = None
    ip_entities: Any = None
    controller_mutation_window: Any = None
    shadow: Any = None

    @field_validator("request_time", "ip_entities", "controller_mutation_window", "shadow")
    @classmethod
    def _live_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(_LIVE_ONLY[str(info.field_name)])
        return value

    @field_validator("entities", mode="before")
    @classmethod
    def _no_ip_entities(cls, value: Any) -> Any:
        return _no_ip_entries(value, "quotas.shadow.entities",
                              "the shadow evaluates user and client-id quotas only")

    def settings(self) -> QuotaSettings:
        """The candidate's budgets, converted as the live quotas and the replay convert
        theirs (``settings_from_section``)."""
        return settings_from_section(self.model_dump(
            exclude_none=True, include={"window", "cap_byte_rate_throttle", "pacing", "entities"}))


def _no_ip_entries(value: Any, where: str, advice: str) -> Any:
    """A list of user/client-id entities refuses an entry naming an ip, saying where it goes."""
    if isinstance(value, list):
        for i, e in enumerate(value):
            if isinstance(e, dict) and "ip" in e:
                raise ValueError(f"{where}.{i} names an ip: {advice}")
    return value


_LIVE_ONLY = {
    "request_time": "a request's time is measured once, by quotas.request_time: the shadow "
    "charges each request what the live quotas charge it (as a replay of the capture does)",
    "ip_entities": "the shadow evaluates user and client-id quotas only",
    "controller_mutation_window": "the shadow evaluates producer_byte_rate, "
    "consumer_byte_rate and request_percentage only",
    "shadow": "a shadow has no shadow of its own",
}


class QuotasConfig(_Model):
    window: QuotaWindowConfig = QuotaWindowConfig()
    controller_mutation_window: QuotaWindowConfig = Field(
        default=QuotaWindowConfig(),
        description="Kafka's controller.quota.window.num and controller.quota.window.size.seconds: "
        "the token bucket of controller_mutation_rate holds rate x samples x size_seconds.")
    request_time: RequestTimeConfig = RequestTimeConfig()
    cap_byte_rate_throttle: bool = Field(
        default=False,
        description="Bound byte-rate throttles at one window, like request-time throttles "
        "(Kafka leaves them unbounded).",
    )
    pacing: Pacing = PACING
    entities: list[QuotaEntityConfig] = []
    ip_entities: list[IpQuotaEntityConfig] = Field(
        default=[], description="ip entities and their connection_creation_rate (KIP-612).")
    admin_principals: list[str] = Field(
        default=[], description="Principals that may alter and describe client quotas "
        "(AlterClientQuotas, DescribeClientQuotas); ``User:`` prefix optional.")
    describe_principals: list[str] = Field(
        default=[], description="Principals that may describe client quotas, besides "
        "admin_principals.")
    overrides: QuotaOverridesConfig = QuotaOverridesConfig()
    metrics_top_entities: int = Field(
        default=100, ge=0, le=10_000,
        description="Per-entity quota metrics are exported for this many busiest budgets.",
    )
    sensor_idle_expiry_seconds: float = Field(
        default=3600.0, ge=1, le=86_400,
        description="A quota budget (one per user/client-id entity) not recorded into for this "
        "long is dropped, as Kafka drops inactive quota sensors after an hour; what bounds the "
        "budgets of client-ids and users that come and go.",
    )
    watch_seconds: float = Field(
        default=2.0, ge=0,
        description="How often the config file is checked for changes (0: only on SIGHUP).",
    )
    shadow: ShadowQuotasConfig | None = Field(
        default=None, description="A candidate config evaluated live beside this one, with "
        "no effect on clients: the throttles it would have imposed, per entity, in the "
        "metrics (docs/shadow-quotas.md). On and off by reload.")

    @field_validator("entities", mode="before")
    @classmethod
    def _no_ip_entities(cls, value: Any) -> Any:
        return _no_ip_entries(value, "quotas.entities", "ip entities go in quotas.ip_entities")

    def may_alter(self, principal: str) -> bool:
        return principal in {_principal(p) for p in self.admin_principals}

    def may_describe(self, principal: str) -> bool:
        return self.may_alter(principal) or principal in {
            _principal(p) for p in self.describe_principals}

    def static_quotas(self) -> dict[Entity, dict[str, float]]:
        """``entities`` as client quota entities (``quota.client_quotas``)."""
        out: dict[Entity, dict[str, float]] = {}
        for e in self.entities:
            values = out.setdefault(from_entity_key(e.key()), {})
            values.update({qt.value: v for qt, v in e.quotas().items()})
            if e.controller_mutation_rate is not None:
                values[CONTROLLER_MUTATION_RATE] = e.controller_mutation_rate
        for ip in self.ip_entities:
            out.setdefault(ip.entity(), {})[CONNECTION_CREATION_RATE] = float(
                ip.connection_creation_rate)
        return out

    def mutation_rates(self) -> dict[EntityKey, float]:
        """``controller_mutation_rate`` per entity (KIP-599), as the token buckets use them."""
        return {e.key(): e.controller_mutation_rate for e in self.entities
                if e.controller_mutation_rate is not None}

    def with_overrides(self, overrides: Mapping[Entity, Mapping[str, float]]) -> QuotasConfig:
        """These quotas with altered ones over ``entities`` (per entity and key), as
        ``entities`` (user and client-id entities: byte rates, request percentage and
        controller mutation rate) and ``ip_entities`` (connection creation rate)."""
        if not overrides:
            return self
        merged = self.static_quotas()
        for entity, values in overrides.items():
            merged.setdefault(entity, {}).update(values)
        entities = []
        ips = []
        known = {qt.value for qt in QuotaType} | {CONTROLLER_MUTATION_RATE}
        for entity, values in sorted(merged.items(), key=lambda kv: repr(kv[0])):
            key = entity_key(entity)
            if key is None:  # an ip entity (KIP-612)
                rate = values.get(CONNECTION_CREATION_RATE)
                address = entity[0][1]
                if rate is not None:
                    ips.append(IpQuotaEntityConfig(
                        ip=DEFAULT_NAME if address is None else address,
                        connection_creation_rate=int(rate)))
                continue
            kept = {k: v for k, v in values.items() if k in known}
            if not kept:
                continue
            entities.append(QuotaEntityConfig.model_validate({
                "user": _config_name(key.user), "client-id": _config_name(key.client_id),
                **{k: (v if k in _DOUBLE_KEYS else int(v)) for k, v in kept.items()}}))
        return self.model_copy(update={"entities": entities, "ip_entities": ips})

    def settings(self) -> QuotaSettings:
        """The same conversion the replay applies to the ``quotas-*.json`` next to a
        capture, so the two cannot drift apart."""
        return settings_from_section(self.model_dump(exclude_none=True))

    def shadow_settings(self) -> QuotaSettings | None:
        """The shadow's budgets while it is on (None: off)."""
        shadow = self.shadow
        return shadow.settings() if shadow is not None and shadow.enabled else None

    def without_shadow(self) -> QuotasConfig:
        """These quotas as the live budgets take them: a change of the shadow alone leaves
        the live quotas (their generation, the capture's config files) as they were."""
        return self if self.shadow is None else self.model_copy(update={"shadow": None})


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
    exempt_users: list[str] = Field(
        default=[], description="Principals never throttled by storage (the authenticated "
        "user, as quotas name it; Kafka's User: prefix optional).")
    exempt_client_ids: list[str] = Field(
        default=[], description="Refused: a client-id is chosen by the client, so any client "
        "could claim the exemption. Exempt principals with exempt_users.")
    pause_throttle_ms: int = Field(default=1000, ge=1, le=300_000)
    evaluate_seconds: float = Field(default=1.0, gt=0, le=60)
    max_clock_skew_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="A volume snapshot stamped further ahead of "
        "this proxy's clock is refused (counted and logged).")
    secret: SecretStr | None = Field(
        default=None, min_length=16, description="Opt-in: a secret shared by the volume agents "
        "and the proxies; the agents sign each snapshot with it (HMAC-SHA256 in a record "
        "header) and the proxies refuse snapshots not signed with it.")
    agent: VolumeAgentConfig | None = None

    @field_validator("exempt_users")
    @classmethod
    def _principals(cls, value: list[str]) -> list[str]:
        return [_principal(p) for p in value]  # as Client.user holds them

    @field_validator("exempt_client_ids")
    @classmethod
    def _no_client_ids(cls, value: list[str]) -> list[str]:
        if value:
            raise ValueError(
                "storage exemptions by client-id are refused: any client can send any "
                "client-id (Kafka exempts by principal, never by client-id); exempt the "
                "authenticated principal with exempt_users (e.g. volume-agent or "
                "User:volume-agent)")
        return value

    def policy(self) -> StoragePolicy:
        return StoragePolicy(
            self.soft.limit() if self.soft is not None else None, self.hard.limit(),
            int(self.stale_after_seconds * 1000), StorageState(self.on_missing))


class CoordinationConfig(_Model):
    """Quota budgets shared by every process of every proxy instance on one cluster
    (``docs/scale-out.md``): each process publishes its usage of every limited budget to a
    compacted topic every ``report_ms`` and enforces Kafka's maths on the sum."""

    enabled: bool | Literal["auto"] = Field(
        default="auto", description="true, false, or auto: on when workers > 1. Instances that "
        "serve the same clients need it set to true. Needs a restart to change.")
    instance: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="This instance's id in the usage reports (default: the host name).")
    topic: str = Field(default="__kafka_quota_proxy_usage", min_length=1, max_length=249)
    report_ms: int = Field(default=250, ge=20, le=10_000)
    staleness_ms: int = Field(default=2000, ge=100, le=600_000)
    expected_processes: int | None = Field(
        default=None, ge=1, le=100_000,
        description="The fallback's divisor before any report has been read (default: this "
        "instance's workers).")
    create_topic: bool = True
    max_clock_skew_ms: int = Field(
        default=30_000, ge=100, le=3_600_000, description="A usage report stamped further "
        "ahead of this process's clock is refused (counted and logged).")
    secret: SecretStr | None = Field(
        default=None, min_length=16, description="Opt-in: a secret shared by every proxy "
        "instance; each report is signed with it (HMAC-SHA256 in a record header) and reports "
        "not signed with it are refused.")

    @model_validator(mode="after")
    def _staleness_covers_reports(self) -> CoordinationConfig:
        if self.staleness_ms < 2 * self.report_ms:
            raise ValueError(f"staleness_ms ({self.staleness_ms}) must be at least twice "
                             f"report_ms ({self.report_ms})")
        return self


class ProxyConfig(_Model):
    workers: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        default=1, description="Processes serving the listeners together (SO_REUSEPORT): a "
        "number, or auto (the cores available). Needs a restart to change.")
    listeners: ListenersConfig
    upstream: UpstreamConfig
    metrics: MetricsConfig = MetricsConfig()
    logging: LoggingConfig = LoggingConfig()
    network: NetworkConfig = NetworkConfig()
    quotas: QuotasConfig = QuotasConfig()
    racks: RacksConfig | None = None
    capture: CaptureConfig | None = None
    storage: StorageConfig | None = None
    coordination: CoordinationConfig = CoordinationConfig()
    acls: AclsConfig | None = Field(
        default=None, description="Authorization at the proxy with Kafka's ACL semantics "
        "(docs/acls.md); off when absent. Turning it on or off needs a restart; its bindings "
        "and super users reload.")


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
    acls: Any = None
    coordination: Any = None
    workers: Any = None

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


