"""Checks across fields of a validated configuration, each reported at the field that has
to change (listeners that would collide, a quota entity configured twice)."""

from __future__ import annotations

import ipaddress
from typing import Any

from kafka_quota_proxy.config.schema import ProxyConfig, QuotasConfig
from kafka_quota_proxy.config.security import ListenerSecurity
from kafka_quota_proxy.quota.connection_rate import address_of
from kafka_quota_proxy.quota.entities import ANONYMOUS, DEFAULT_NAME, EntityKey

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
    """Checks across fields, each reported at the field that has to change: no two listeners
    (bootstrap ports, broker port ranges of every kind, the metrics port) may share a port on
    addresses that can clash."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    # (where, what, host, first port, last port), in the order of the file
    claims: list[tuple[tuple[str | int, ...], str, str, int, int]] = []
    for i, (name, kind) in enumerate(config.listeners.kinds()):
        at: tuple[str | int, ...] = (("listeners",) if name is None
                                     else ("listeners", "extra", i - 1))
        label = "" if name is None else f"listener {name}: "
        claims.append(((*at, "bootstrap"), f"{label}bootstrap port {kind.bootstrap.port}",
                       kind.bootstrap.host, kind.bootstrap.port, kind.bootstrap.port))
        ports = kind.broker_ports
        claims.append(((*at, "broker_ports"), f"{label}broker_ports {ports}", kind.broker_host,
                       ports.first, ports.last))
    for i, (name, kind) in enumerate(config.listeners.kinds()):
        at = ("listeners",) if name is None else ("listeners", "extra", i - 1)
        problems.extend(proxy_protocol_checks(kind.security, (*at, "security")))
    names: set[str] = set()
    for i, kind in enumerate(config.listeners.extra):
        if kind.name in names:
            problems.append((("listeners", "extra", i, "name"),
                             f"listener name {kind.name} is used twice"))
        names.add(kind.name)
    listen = config.metrics.listen
    if listen is not None:
        claims.append((("metrics", "listen"), f"metrics.listen port {listen.port}", listen.host,
                       listen.port, listen.port))
    for j, (where, what, host, first, last) in enumerate(claims):
        for _, other, other_host, o_first, o_last in claims[:j]:
            if first <= o_last and o_first <= last and _may_collide(host, other_host):
                problems.append((where, f"{what} collides with {other}"))
                break
    problems.extend(quota_checks(config.quotas))
    if config.storage is not None:
        problems.extend(storage_checks(config))
    return problems


def proxy_protocol_checks(security: ListenerSecurity, at: tuple[str | int, ...]
                          ) -> list[tuple[tuple[str | int, ...], str]]:
    """A listener that takes PROXY protocol headers names who may send them: the header is
    trusted as sent, so anyone else able to reach the port could claim any address."""
    if security.proxy_protocol != "none" and not security.proxy_protocol_trusted_sources:
        return [((*at, "proxy_protocol"),
                 f"proxy_protocol {security.proxy_protocol} needs "
                 "proxy_protocol_trusted_sources: the networks of the load balancers allowed "
                 "to send the header (any other client could claim any address)")]
    if security.proxy_protocol == "none" and security.proxy_protocol_trusted_sources:
        return [((*at, "proxy_protocol_trusted_sources"),
                 "proxy_protocol_trusted_sources is set but proxy_protocol is none")]
    return []


def storage_checks(config: ProxyConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """Storage exemptions name principals no client can claim: not ANONYMOUS (every client
    without an authenticated principal), not a SASL listener's fallback principal (every
    client of a mechanism the proxy cannot read)."""
    storage = config.storage
    assert storage is not None
    problems: list[tuple[tuple[str | int, ...], str]] = []
    fallbacks = {kind.security.sasl.fallback_principal
                 for _, kind in config.listeners.kinds()
                 if kind.security.uses_sasl and not kind.security.terminates_sasl}
    for i, user in enumerate(storage.exempt_users):
        principal = user[5:] if user.startswith("User:") else user
        if principal == ANONYMOUS:
            problems.append((("storage", "exempt_users", i),
                             "ANONYMOUS is every client without an authenticated principal: "
                             "exempt an authenticated principal (SASL or mTLS)"))
        elif principal in fallbacks:
            problems.append((("storage", "exempt_users", i),
                             f"{principal} is a SASL listener's fallback_principal, given to "
                             "every client of a mechanism the proxy cannot read: exempt a "
                             "principal the proxy reads"))
    return problems


def quota_checks(quotas: QuotasConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks across the ``quotas`` section: each entity is configured once (an ip entity
    once per address, however the address is written)."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    sections: list[tuple[tuple[str, ...], list[Any]]] = [(("quotas",), list(quotas.entities))]
    if quotas.shadow is not None:  # (the candidate's entities, each once too)
        sections.append((("quotas", "shadow"), list(quotas.shadow.entities)))
    paced: list[tuple[tuple[str, ...], Any]] = [(("quotas",), quotas)]
    if quotas.shadow is not None:
        paced.append((("quotas", "shadow"), quotas.shadow))
    for at, section in paced:
        if section.pacing == "strict" and section.cap_byte_rate_throttle:
            problems.append(((*at, "cap_byte_rate_throttle"), "strict pacing pays each "
                             "request in full, which a throttle bounded at one window cannot: "
                             "set cap_byte_rate_throttle: false, or pacing: kafka"))
    for at, entities in sections:
        seen: dict[EntityKey, int] = {}
        for i, entity in enumerate(entities):
            key = entity.key()
            if key in seen:
                problems.append(((*at, "entities", i), f"entity {key.path} is already "
                                 f"configured at {'.'.join(at)}.entities.{seen[key]}"))
            seen.setdefault(key, i)
    addresses: dict[object, int] = {}  # the same address however written (ip_address)
    for i, ip in enumerate(quotas.ip_entities):
        address = address_of(ip.ip) if ip.ip != DEFAULT_NAME else DEFAULT_NAME
        if address in addresses:
            problems.append((("quotas", "ip_entities", i, "ip"),
                             f"ip {ip.ip} is already configured at quotas.ip_entities."
                             f"{addresses[address]}"))
        addresses.setdefault(address, i)
    return problems

