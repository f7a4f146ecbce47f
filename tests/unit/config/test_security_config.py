"""The security sections of the configuration (``listeners.security``, ``upstream.tls``,
``upstream.sasl``): defaults, values, and the positioned errors of their cross-field rules."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.config.security import ListenerSecurity, SaslConfig
from kafka_quota_proxy.security.principal_mapping import PrincipalMapper
from testkit import config_errors

SOURCE = "security.yaml"

BASE = config_errors.BASE  # (its line numbers are there)


def with_listener_security(block: str) -> str:
    """BASE with ``listeners.security`` set to ``block`` (YAML under ``security:``); the
    ``security:`` key is on line 5, the block's first line on line 6."""
    indented = textwrap.indent(textwrap.dedent(block), "    ")
    return BASE.replace('  broker_ports: "9193-9292"\n',
                        f'  broker_ports: "9193-9292"\n  security:\n{indented}')


def with_upstream(block: str) -> str:
    """BASE with ``block`` appended under ``upstream:`` (its first line is line 7)."""
    return BASE + textwrap.indent(textwrap.dedent(block), "  ")


def single_error(text: str) -> dict[str, Any]:
    return config_errors.single_error(text, SOURCE)


TLS = """\
tls:
  cert_file: /certs/proxy.pem
  key_file: /certs/proxy.key
"""


# ------------------------------------------------------------------ defaults and values


def test_defaults_without_security_sections() -> None:
    cfg = parse_config(BASE, SOURCE)
    security = cfg.listeners.security
    assert security.protocol == "PLAINTEXT"
    assert security.tls is None
    assert security.proxy_protocol == "none"
    assert security.ssl_principal_mapping_rules == "DEFAULT"
    assert not security.uses_tls and not security.uses_sasl
    sasl = security.sasl
    assert (sasl.mode, sasl.fallback_principal, sasl.oauthbearer_principal_claim) == (
        "inspect", "ANONYMOUS", "sub")
    assert sasl.oauthbearer_jwks_file is None
    assert cfg.upstream.tls is None
    assert cfg.upstream.sasl is None


def test_ssl_listener_values_and_tls_defaults() -> None:
    cfg = parse_config(with_listener_security("protocol: SSL\n" + TLS), SOURCE)
    security = cfg.listeners.security
    assert security.protocol == "SSL"
    assert security.uses_tls and not security.uses_sasl
    tls = security.tls
    assert tls is not None
    assert (tls.cert_file, tls.key_file) == ("/certs/proxy.pem", "/certs/proxy.key")
    assert tls.client_auth == "none"
    assert tls.client_ca_file is None and tls.key_password_file is None
    assert tls.min_version == "1.2"
    assert tls.ciphers is None
    assert tls.reload_seconds == 10.0


def test_sasl_ssl_with_mtls_and_every_sasl_key() -> None:
    cfg = parse_config(with_listener_security("""\
        protocol: SASL_SSL
        tls:
          cert_file: c.pem
          key_file: c.key
          client_ca_file: ca.pem
          client_auth: requested
          min_version: "1.3"
          reload_seconds: 0
        ssl_principal_mapping_rules: ["RULE:^CN=(.*?),.*$/$1/L", "DEFAULT"]
        proxy_protocol: v2
        proxy_protocol_trusted_sources: ["10.0.0.0/24", "fd00::/8", "192.0.2.7"]
        sasl:
          fallback_principal: kerberos-user
          oauthbearer_principal_claim: client_id
          oauthbearer_jwks_file: /etc/jwks.json
        """), SOURCE)
    security = cfg.listeners.security
    assert security.uses_tls and security.uses_sasl
    assert security.tls is not None
    assert security.tls.client_auth == "requested"
    assert security.tls.client_ca_file == "ca.pem"
    assert security.tls.min_version == "1.3"
    assert security.tls.reload_seconds == 0
    assert security.proxy_protocol == "v2"
    assert security.proxy_protocol_trusted_sources == ["10.0.0.0/24", "fd00::/8", "192.0.2.7"]
    assert security.sasl == SaslConfig(fallback_principal="kerberos-user",
                                       oauthbearer_principal_claim="client_id",
                                       oauthbearer_jwks_file="/etc/jwks.json")
    mapper = security.principal_mapper()
    assert isinstance(mapper, PrincipalMapper)
    assert security.ssl_principal_mapping_rules == ["RULE:^CN=(.*?),.*$/$1/L", "DEFAULT"]


def test_sasl_plaintext_needs_no_tls() -> None:
    security = parse_config(with_listener_security("protocol: SASL_PLAINTEXT\n"),
                            SOURCE).listeners.security
    assert security.uses_sasl and not security.uses_tls


def test_upstream_tls_and_sasl_values() -> None:
    cfg = parse_config(with_upstream("""\
        tls:
          ca_file: /certs/ca.pem
          cert_file: /certs/me.pem
          key_file: /certs/me.key
          check_hostname: false
        sasl:
          mechanism: SCRAM-SHA-512
          username: proxy
          password_file: /secrets/proxy
        """), SOURCE)
    tls, sasl = cfg.upstream.tls, cfg.upstream.sasl
    assert tls is not None and sasl is not None
    assert (tls.ca_file, tls.cert_file, tls.key_file) == (
        "/certs/ca.pem", "/certs/me.pem", "/certs/me.key")
    assert tls.check_hostname is False
    assert tls.min_version == "1.2"
    assert (sasl.mechanism, sasl.username, sasl.password_file) == (
        "SCRAM-SHA-512", "proxy", "/secrets/proxy")


def test_upstream_tls_defaults_verify_hostname_with_system_cas() -> None:
    tls = parse_config(with_upstream("tls: {}\n"), SOURCE).upstream.tls
    assert tls is not None
    assert tls.ca_file is None and tls.cert_file is None and tls.key_file is None
    assert tls.check_hostname is True


def test_listener_security_is_frozen() -> None:
    security = parse_config(BASE, SOURCE).listeners.security
    with pytest.raises(ValueError, match="frozen"):
        security.protocol = "SSL"


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_ssl_without_tls_names_the_section(protocol: str) -> None:
    e = single_error(with_listener_security(f"protocol: {protocol}\n"))
    assert e["path"] == "listeners.security"
    assert e["msg"] == f"protocol {protocol} needs tls"
    assert (e["line"], e["col"]) == (5, 3)


@pytest.mark.parametrize("protocol", [None, "PLAINTEXT", "SASL_PLAINTEXT"])
def test_tls_without_an_ssl_protocol_is_an_error(protocol: str | None) -> None:
    block = ("" if protocol is None else f"protocol: {protocol}\n") + TLS
    e = single_error(with_listener_security(block))
    assert e["path"] == "listeners.security"
    assert e["msg"] == f"tls is set but protocol is {protocol or 'PLAINTEXT'}"


@pytest.mark.parametrize("mode", ["requested", "required"])
def test_client_auth_needs_client_ca_file(mode: str) -> None:
    e = single_error(with_listener_security(
        "protocol: SSL\n" + TLS + f"  client_auth: {mode}\n"))
    assert e["path"] == "listeners.security.tls"
    assert e["msg"] == f"client_auth {mode} needs client_ca_file"
    assert e["line"] == 7  # the tls: key


def test_client_auth_none_needs_no_ca() -> None:
    cfg = parse_config(with_listener_security("protocol: SSL\n" + TLS + "  client_auth: none\n"),
                       SOURCE)
    assert cfg.listeners.security.tls is not None


def test_unknown_protocol_is_an_error() -> None:
    e = single_error(with_listener_security("protocol: TLS\n"))
    assert e["path"] == "listeners.security.protocol"
    assert "SASL_SSL" in e["msg"]
    assert (e["line"], e["col"]) == (6, 5)  # the protocol: key


@pytest.mark.parametrize("rules", ['"RULE:broken"', '["DEFAULT", "RULE:broken"]'])
def test_malformed_mapping_rule_names_the_rule(rules: str) -> None:
    e = single_error(with_listener_security(f"ssl_principal_mapping_rules: {rules}\n"))
    assert e["path"] == "listeners.security.ssl_principal_mapping_rules"
    assert "RULE:broken" in e["msg"]
    assert e["line"] == 6


def test_mapping_rules_are_parsed_once_valid() -> None:
    rules = ["RULE:^CN=([^,]+),OU=clients.*$/$1/U", "DEFAULT"]
    security = ListenerSecurity(ssl_principal_mapping_rules=rules)
    assert security.ssl_principal_mapping_rules == rules
    assert security.principal_mapper() is not None


def test_empty_cert_file_is_an_error() -> None:
    e = single_error(with_listener_security(
        'protocol: SSL\ntls:\n  cert_file: ""\n  key_file: k\n'))
    assert e["path"] == "listeners.security.tls.cert_file"


def test_negative_reload_seconds_is_an_error() -> None:
    e = single_error(with_listener_security("protocol: SSL\n" + TLS + "  reload_seconds: -1\n"))
    assert e["path"] == "listeners.security.tls.reload_seconds"


def test_unknown_proxy_protocol_is_an_error() -> None:
    e = single_error(with_listener_security("proxy_protocol: v3\n"))
    assert e["path"] == "listeners.security.proxy_protocol"


def test_unknown_key_in_security_is_an_error() -> None:
    e = single_error(with_listener_security("protocl: SSL\n"))
    assert e["path"] == "listeners.security.protocl"


def test_unknown_sasl_mode_is_an_error() -> None:
    e = single_error(with_listener_security("protocol: SASL_PLAINTEXT\nsasl:\n  mode: relay\n"))
    assert e["path"] == "listeners.security.sasl.mode"
    assert "'inspect'" in e["msg"]


@pytest.mark.parametrize("present,missing", [("cert_file", "key_file"),
                                             ("key_file", "cert_file")])
def test_upstream_cert_and_key_go_together(present: str, missing: str) -> None:
    e = single_error(with_upstream(f"tls:\n  {present}: /certs/x\n"))
    assert e["path"] == "upstream.tls"
    assert e["msg"] == "cert_file and key_file go together"
    assert (e["line"], e["col"]) == (7, 3)


def test_upstream_sasl_mechanism_must_be_one_the_proxy_speaks() -> None:
    e = single_error(with_upstream(
        "sasl:\n  mechanism: GSSAPI\n  username: u\n  password_file: p\n"))
    assert e["path"] == "upstream.sasl.mechanism"
    assert (e["line"], e["col"]) == (8, 5)  # the mechanism: key


def test_upstream_sasl_needs_a_password_file() -> None:
    e = single_error(with_upstream("sasl:\n  mechanism: PLAIN\n  username: u\n"))
    assert e["path"] == "upstream.sasl.password_file"
