"""Which rack a consumer is in: the Fetch request's ``rack_id`` when it sends one; else the
first configured rule that matches its client-id (a regular expression, matched from the
start) or its source address (a network); else the proxy's own rack; else unknown."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class RackRule:
    rack: str
    client_id: re.Pattern[str] | None = None
    network: IPNetwork | None = None

    def matches(self, client_id: str, address: str | None) -> bool:
        if self.client_id is not None and self.client_id.match(client_id) is None:
            return False
        if self.network is not None:
            if address is None:
                return False
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                return False
            if ip not in self.network:
                return False
        return True


class ClientRacks:
    def __init__(self, rules: Sequence[RackRule] = (), proxy_rack: str | None = None) -> None:
        self.rules = tuple(rules)
        self.proxy_rack = proxy_rack or None

    def rack_for(self, request_rack: str, client_id: str,
                 address: str | None) -> tuple[str | None, str]:
        """``(rack, source)``; source is ``request``, ``rule``, ``proxy`` or ``none``."""
        if request_rack:
            return request_rack, "request"
        for rule in self.rules:
            if rule.matches(client_id, address):
                return rule.rack, "rule"
        if self.proxy_rack:
            return self.proxy_rack, "proxy"
        return None, "none"
