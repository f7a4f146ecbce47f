"""More kinds of client listeners (``listeners.extra``, Kafka's listener map): each with its own
bootstrap, broker ports and security; names; the advertised host; and the port collisions
``config.checks.cross_checks`` reports at the field to change."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.config.schema import (
    ExtraListenerConfig,
    HostPort,
    ListenersConfig,
    PortRange,
)
from testkit import config_errors

SOURCE = "kinds.yaml"

# Line numbers:  1 listeners  5 extra  6 - name: INTERNAL  7 bootstrap  8 broker_ports
#   9 security  12 - name: EXTERNAL  13 bootstrap  14 advertised_host  15 broker_ports
#   16 security  19 upstream
TWO_KINDS = """\
listeners:
  bootstrap: "127.0.0.1:9192"
  advertised_host: "proxy.example"
  broker_ports: "9193-9292"
  extra:
    - name: INTERNAL
      bootstrap: "127.0.0.1:9392"
      broker_ports: "9393-9492"
      security:
        protocol: SASL_PLAINTEXT
        sasl: {mode: terminate, credentials_file: /etc/proxy/users.yaml}
    - name: EXTERNAL
      bootstrap: "127.0.0.1:9592"
      advertised_host: "external.example"
      broker_ports: "9593-9692"
      security:
        protocol: SSL
        tls: {cert_file: /certs/proxy.pem, key_file: /certs/proxy.key}
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
"""

ONE_EXTRA = """\
listeners:
  bootstrap: "127.0.0.1:9192"
  advertised_host: "proxy.example"
  broker_ports: "9193-9292"
  extra:
    - name: {name}
      bootstrap: "{bootstrap}"
      broker_ports: "{ports}"
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
"""


def one_extra(name: str = "INTERNAL", bootstrap: str = "127.0.0.1:9392",
              ports: str = "9393-9492") -> str:
    return ONE_EXTRA.format(name=name, bootstrap=bootstrap, ports=ports)


def line_of(text: str, fragment: str, nth: int = 0) -> int:
    """The 1-based line of the ``nth`` line holding ``fragment``."""
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if fragment in line]
    return lines[nth]


def single_error(text: str) -> dict[str, Any]:
    return config_errors.single_error(text, SOURCE)


# ------------------------------------------------------------------ kinds


def test_without_extra_there_is_one_kind() -> None:
    text = one_extra().split("  extra:")[0] + "upstream:\n  bootstrap_servers: [\"h:9092\"]\n"
    listeners = parse_config(text, SOURCE).listeners
    assert listeners.extra == []
    assert listeners.kinds() == [(None, listeners)]
    assert listeners.advertised(listeners) == "proxy.example"


def test_two_extra_kinds_parse_with_their_own_security() -> None:
    listeners = parse_config(TWO_KINDS, SOURCE).listeners
    assert isinstance(listeners, ListenersConfig)
    kinds = listeners.kinds()
    assert [name for name, _ in kinds] == [None, "INTERNAL", "EXTERNAL"]
    main, internal, external = (kind for _, kind in kinds)
    assert main is listeners
    assert isinstance(internal, ExtraListenerConfig) and isinstance(external, ExtraListenerConfig)
    # each its own ports
    assert (main.bootstrap, main.broker_ports) == (HostPort("127.0.0.1", 9192),
                                                   PortRange(9193, 9292))
    assert (internal.bootstrap, internal.broker_ports) == (HostPort("127.0.0.1", 9392),
                                                           PortRange(9393, 9492))
    assert (external.bootstrap, external.broker_ports) == (HostPort("127.0.0.1", 9592),
                                                           PortRange(9593, 9692))
    # each its own security; the main kind keeps the default
    assert main.security.protocol == "PLAINTEXT" and not main.security.uses_sasl
    assert internal.security.protocol == "SASL_PLAINTEXT"
    assert internal.security.terminates_sasl
    assert internal.security.sasl.credentials_file == "/etc/proxy/users.yaml"
    assert not internal.security.uses_tls
    assert external.security.protocol == "SSL" and external.security.uses_tls
    assert external.security.tls is not None
    assert external.security.tls.cert_file == "/certs/proxy.pem"
    assert not external.security.uses_sasl


def test_advertised_host_defaults_to_the_main_one() -> None:
    listeners = parse_config(TWO_KINDS, SOURCE).listeners
    main, internal, external = (kind for _, kind in listeners.kinds())
    assert internal.advertised_host is None
    assert listeners.advertised(internal) == "proxy.example"
    assert listeners.advertised(external) == "external.example"
    assert listeners.advertised(main) == "proxy.example"


def test_broker_listen_host_defaults_to_the_kinds_bootstrap_host() -> None:
    text = one_extra(bootstrap="127.0.0.2:9392")
    (_, _), (_, extra) = parse_config(text, SOURCE).listeners.kinds()
    assert extra.broker_host == "127.0.0.2"
    text = text.replace('      broker_ports: "9393-9492"\n',
                        '      broker_ports: "9393-9492"\n      broker_listen_host: "0.0.0.0"\n')
    (_, _), (_, extra) = parse_config(text, SOURCE).listeners.kinds()
    assert extra.broker_host == "0.0.0.0"


def test_config_is_frozen() -> None:
    listeners = parse_config(TWO_KINDS, SOURCE).listeners
    with pytest.raises(Exception, match="frozen"):
        listeners.extra[0].name = "OTHER"  # type: ignore[misc]


# ------------------------------------------------------------------ names


def test_duplicate_names_are_an_error() -> None:
    e = single_error(TWO_KINDS.replace("name: EXTERNAL", "name: INTERNAL"))
    assert (e["path"], e["line"]) == ("listeners.extra.1.name", 12)  # at the second one
    assert e["msg"] == "listener name INTERNAL is used twice"


def test_names_differing_in_case_are_distinct() -> None:
    listeners = parse_config(TWO_KINDS.replace("name: EXTERNAL", "name: internal"),
                             SOURCE).listeners
    assert [name for name, _ in listeners.kinds()] == [None, "INTERNAL", "internal"]


@pytest.mark.parametrize("name", ['"1ST"', '"has space"', '"_x"', '"a.b"', '""', "A" * 33,
                                  '"INTERNAL:"'])
def test_invalid_name(name: str) -> None:
    text = one_extra(name=name)
    e = single_error(text)
    assert e["path"] == "listeners.extra.0.name"
    assert e["line"] == line_of(text, "- name:")
    assert "pattern" in e["msg"]


@pytest.mark.parametrize("name", ["A", "INTERNAL", "ssl-2", "Client_Net", "z" * 32])
def test_valid_names(name: str) -> None:
    (_, _), (got, _) = parse_config(one_extra(name=name), SOURCE).listeners.kinds()
    assert got == name


def test_name_is_required() -> None:
    text = one_extra().replace("    - name: INTERNAL\n      bootstrap", "    - bootstrap")
    e = single_error(text)
    assert (e["path"], e["line"]) == ("listeners.extra.0.name", line_of(text, "- bootstrap"))
    assert "missing" in e["msg"]


@pytest.mark.parametrize(("block", "where"), [
    ("      colour: blue\n", "listeners.extra.0.colour"),
    ("      security: {protocol: SASL_SSL}\n", "listeners.extra.0.security"),
    ("      security: {protocol: SASL_PLAINTEXT, sasl: {mode: terminate}}\n",
     "listeners.extra.0.security.sasl"),
])
def test_an_extra_kinds_own_fields_are_checked(block: str, where: str) -> None:
    text = one_extra().replace('      broker_ports: "9393-9492"\n',
                               '      broker_ports: "9393-9492"\n' + block)
    e = single_error(text)
    assert e["path"] == where
    assert e["line"] == line_of(text, block.strip().split(":")[0] + ":", -1)


# ------------------------------------------------------------------ collisions


def test_extra_bootstrap_colliding_with_the_main_broker_ports() -> None:
    text = one_extra(bootstrap="127.0.0.1:9200")
    e = single_error(text)
    assert (e["path"], e["line"], e["col"]) == ("listeners.extra.0.bootstrap",
                                                line_of(text, "127.0.0.1:9200"), 7)
    assert e["msg"] == ("listener INTERNAL: bootstrap port 9200 collides with "
                        "broker_ports 9193-9292")


def test_extra_bootstrap_colliding_with_the_main_bootstrap() -> None:
    e = single_error(one_extra(bootstrap="0.0.0.0:9192", ports="9393-9492"))
    assert e["path"] == "listeners.extra.0.bootstrap"
    assert e["msg"] == "listener INTERNAL: bootstrap port 9192 collides with bootstrap port 9192"


def test_extra_broker_ports_colliding_with_the_main_kind() -> None:
    text = one_extra(ports="9292-9300")  # shares 9292
    e = single_error(text)
    assert (e["path"], e["line"]) == ("listeners.extra.0.broker_ports",
                                      line_of(text, "9292-9300"))
    assert e["msg"] == ("listener INTERNAL: broker_ports 9292-9300 collides with "
                        "broker_ports 9193-9292")


def test_extra_bootstrap_inside_its_own_broker_ports() -> None:
    e = single_error(one_extra(bootstrap="127.0.0.1:9400"))
    assert e["path"] == "listeners.extra.0.broker_ports"
    assert e["msg"] == ("listener INTERNAL: broker_ports 9393-9492 collides with "
                        "listener INTERNAL: bootstrap port 9400")


@pytest.mark.parametrize("ports", ["9450-9500", "9393-9400", "9492", "9400-9591"])
def test_overlapping_broker_ports_between_two_extra_kinds(ports: str) -> None:
    text = TWO_KINDS.replace('"9593-9692"', f'"{ports}"')
    e = single_error(text)
    assert (e["path"], e["line"]) == ("listeners.extra.1.broker_ports",
                                      line_of(text, f'"{ports}"'))
    assert e["msg"] == (f"listener EXTERNAL: broker_ports {PortRange.parse(ports)} collides "
                        "with listener INTERNAL: broker_ports 9393-9492")


def test_adjacent_broker_ports_do_not_collide() -> None:
    cfg = parse_config(TWO_KINDS.replace('"9593-9692"', '"9493-9591"'), SOURCE)
    assert cfg.listeners.extra[1].broker_ports == PortRange(9493, 9591)


def test_same_ports_on_distinct_hosts_are_allowed() -> None:
    # EXTERNAL takes INTERNAL's very ports, on 127.0.0.2 instead of 127.0.0.1
    text = (TWO_KINDS.replace('"127.0.0.1:9592"', '"127.0.0.2:9392"')
            .replace('"9593-9692"', '"9393-9492"'))
    listeners = parse_config(text, SOURCE).listeners
    internal, external = listeners.extra
    assert (internal.bootstrap.port, internal.broker_ports) == (
        external.bootstrap.port, external.broker_ports)
    assert (internal.broker_host, external.broker_host) == ("127.0.0.1", "127.0.0.2")
    # and the main kind's ports on another address
    cfg = parse_config(one_extra(bootstrap="127.0.0.2:9192", ports="9193-9292"), SOURCE)
    assert cfg.listeners.extra[0].broker_ports == cfg.listeners.broker_ports


@pytest.mark.parametrize("host", ["0.0.0.0", "localhost", "::"])
def test_same_ports_on_a_wildcard_or_localhost_collide(host: str) -> None:
    bootstrap = f"[{host}]:9392" if ":" in host else f"{host}:9392"
    text = (TWO_KINDS.replace('"127.0.0.1:9592"', f'"{bootstrap}"')
            .replace('"9593-9692"', '"9393-9492"'))
    e = single_error_or_first(text)
    assert e["path"] == "listeners.extra.1.bootstrap"
    assert e["msg"] == ("listener EXTERNAL: bootstrap port 9392 collides with "
                        "listener INTERNAL: bootstrap port 9392")


def single_error_or_first(text: str) -> dict[str, Any]:
    """The first error (its broker ports collide too, reported after)."""
    errors = config_errors.errors_of(text, SOURCE)
    assert len(errors) == 2, errors
    assert "listeners.extra.1.broker_ports" in errors[1]
    return config_errors.parse_error(errors[0], SOURCE)


def test_broker_listen_host_decides_the_broker_ports_collision() -> None:
    # on 127.0.0.2 the extra kind's bootstrap is clear, but its brokers bind 127.0.0.1
    text = one_extra(bootstrap="127.0.0.2:9192", ports="9193-9292").replace(
        '      broker_ports: "9193-9292"\n',
        '      broker_ports: "9193-9292"\n      broker_listen_host: "127.0.0.1"\n')
    e = single_error(text)
    assert e["path"] == "listeners.extra.0.broker_ports"
    assert e["msg"] == ("listener INTERNAL: broker_ports 9193-9292 collides with "
                        "broker_ports 9193-9292")


@pytest.mark.parametrize(("listen", "other"), [
    ("127.0.0.1:9600", "listener EXTERNAL: broker_ports 9593-9692"),
    ("0.0.0.0:9393", "listener INTERNAL: broker_ports 9393-9492"),
    ("127.0.0.1:9592", "listener EXTERNAL: bootstrap port 9592"),
])
def test_metrics_port_colliding_with_an_extra_kind(listen: str, other: str) -> None:
    text = TWO_KINDS + f'metrics:\n  listen: "{listen}"\n'
    e = single_error(text)
    assert (e["path"], e["line"]) == ("metrics.listen", line_of(text, "listen:"))
    port = listen.rsplit(":", 1)[1]
    assert e["msg"] == f"metrics.listen port {port} collides with {other}"


def test_metrics_beside_every_kind_is_allowed() -> None:
    cfg = parse_config(TWO_KINDS + 'metrics:\n  listen: "127.0.0.1:9693"\n', SOURCE)
    assert cfg.metrics.listen == HostPort("127.0.0.1", 9693)
    cfg = parse_config(TWO_KINDS + 'metrics:\n  listen: "127.0.0.2:9600"\n', SOURCE)
    assert cfg.metrics.listen == HostPort("127.0.0.2", 9600)


def test_every_collision_is_reported() -> None:
    text = (TWO_KINDS.replace('"127.0.0.1:9392"', '"127.0.0.1:9250"')
            .replace('"9593-9692"', '"9400-9410"'))
    paths = [config_errors.parse_error(error, SOURCE)["path"]
             for error in config_errors.errors_of(text, SOURCE)]
    assert paths == ["listeners.extra.0.bootstrap", "listeners.extra.1.broker_ports"]
