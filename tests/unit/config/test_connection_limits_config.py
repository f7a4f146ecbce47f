"""Who may hold connections and claim addresses, as configured: ``network.max_connections_per_ip``
and its overrides (Kafka's), and PROXY protocol trusted sources (required with the header);
each refusal positioned ``FILE:LINE:COLUMN``."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.loading import parse_config
from testkit import config_errors

SOURCE = "limits.yaml"
BASE = config_errors.BASE

def single_error(text: str) -> dict[str, object]:
    return config_errors.single_error(text, SOURCE)


def with_security(block: str) -> str:
    """BASE with ``listeners.security`` (``security:`` on line 5, the block from line 6)."""
    lines = "".join(f"    {line}\n" for line in block.splitlines())
    return BASE.replace('  broker_ports: "9193-9292"\n',
                        f'  broker_ports: "9193-9292"\n  security:\n{lines}')


# ------------------------------------------------------------------ max_connections_per_ip


def test_per_ip_defaults_are_kafkas() -> None:
    net = parse_config(BASE, SOURCE).network
    assert net.max_connections_per_ip == 2147483647  # Int.MAX: no limit
    assert net.max_connections_per_ip_overrides == {}


@pytest.mark.parametrize("overrides", ['{"10.0.0.5": 1000, "::1": 0}',
                                       '"10.0.0.5:1000,::1:0"',
                                       '"10.0.0.5:1000, [::1]:0"'])
def test_per_ip_overrides_as_a_mapping_or_kafkas_string(overrides: str) -> None:
    net = parse_config(BASE + f"network:\n  max_connections_per_ip: 5\n"
                       f"  max_connections_per_ip_overrides: {overrides}\n", SOURCE).network
    assert net.max_connections_per_ip == 5
    assert net.max_connections_per_ip_overrides == {"10.0.0.5": 1000, "::1": 0}


@pytest.mark.parametrize("block,line,col,path,fragment", [
    ("  max_connections_per_ip: -1\n", 8, 3, "network.max_connections_per_ip",
     "greater than or equal to 0"),
    ('  max_connections_per_ip_overrides: {"lb.example.com": 10}\n', 8, 3,
     "network.max_connections_per_ip_overrides", "host names are not resolved"),
    ('  max_connections_per_ip_overrides: "10.0.0.5=10"\n', 8, 3,
     "network.max_connections_per_ip_overrides", 'expected "ip:count"'),
    ('  max_connections_per_ip_overrides: {"10.0.0.5": -2}\n', 8, 38,
     "network.max_connections_per_ip_overrides.10.0.0.5", "greater than or equal to 0"),
    ("  max_connections_per_ip: 0\n", 7, 1, "network",
     "needs max_connections_per_ip_overrides"),
])
def test_per_ip_errors_are_positioned(block: str, line: int, col: int, path: str,
                                      fragment: str) -> None:
    e = single_error(BASE + "network:\n" + block)
    assert (e["line"], e["col"], e["path"]) == (line, col, path), e
    assert fragment in str(e["msg"])


# ------------------------------------------------------------------ PROXY protocol sources


def test_proxy_protocol_without_trusted_sources_is_refused_at_its_key() -> None:
    e = single_error(with_security("proxy_protocol: v1\n"))
    assert (e["line"], e["col"], e["path"]) == (6, 5, "listeners.security.proxy_protocol")
    assert "needs proxy_protocol_trusted_sources" in str(e["msg"])


def test_an_extra_listener_kind_is_checked_alike() -> None:
    text = BASE.replace('  broker_ports: "9193-9292"\n', '''  broker_ports: "9193-9292"
  extra:
    - name: LB
      bootstrap: "127.0.0.1:9392"
      broker_ports: "9393-9492"
      security: {proxy_protocol: any}
''')
    e = single_error(text)
    assert (e["line"], e["path"]) == (9, "listeners.extra.0.security.proxy_protocol"), e


def test_trusted_sources_without_proxy_protocol_is_refused() -> None:
    e = single_error(with_security('proxy_protocol_trusted_sources: ["10.0.0.0/8"]\n'))
    assert (e["line"], e["path"]) == (6, "listeners.security.proxy_protocol_trusted_sources")
    assert "proxy_protocol is none" in str(e["msg"])


def test_a_trusted_source_must_be_a_network() -> None:
    e = single_error(with_security(
        'proxy_protocol: v2\nproxy_protocol_trusted_sources: ["10.0.0.0/8", "lb.local"]\n'))
    assert (e["line"], e["path"]) == (7, "listeners.security.proxy_protocol_trusted_sources.1")
    assert "'lb.local' is not a network" in str(e["msg"])


def test_trusted_sources_pass() -> None:
    cfg = parse_config(with_security(
        'proxy_protocol: v2\nproxy_protocol_trusted_sources: ["10.1.0.0/16", "::1"]\n'),
        SOURCE)
    assert cfg.listeners.security.proxy_protocol_trusted_sources == ["10.1.0.0/16", "::1"]
