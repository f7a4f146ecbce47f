"""Checks across fields of a validated configuration, each reported at the field that has
to change (listeners that would collide, a quota entity configured twice)."""

from __future__ import annotations

import ipaddress

from config.schema import ProxyConfig, QuotasConfig
from quota.entities import EntityKey

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

