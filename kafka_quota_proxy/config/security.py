"""The security sections of the configuration: TLS toward clients and brokers, how the proxy
learns each client's principal, PROXY protocol, and the proxy's own identity toward brokers.

Names follow Kafka's: ``protocol`` (Kafka's ``security.protocol``) takes the values of Kafka's
``listener.security.protocol.map`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
``client_auth`` those of ``ssl.client.auth``, ``ssl_principal_mapping_rules`` the syntax of
``ssl.principal.mapping.rules``. Files are named here (config does no I/O): ``check-config``
and ``run`` read each one before anything starts (``proxy.files``, the loader's ``checks``),
reporting one that cannot be used at its key; the proxy reads them at start and again when
they change.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from kafka_quota_proxy.security.principal_mapping import PrincipalMapper

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
TlsVersion = Literal["1.2", "1.3"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerTlsConfig(_Model):
    """TLS toward clients, on the bootstrap and every broker listener."""

    cert_file: str = Field(min_length=1, description="PEM: the certificate, then its chain.")
    key_file: str = Field(min_length=1, description="PEM: the private key.")
    key_password_file: str | None = Field(
        default=None, description="A file holding the key's password, if it is encrypted.")
    client_ca_file: str | None = Field(
        default=None, description="PEM: the CAs that client certificates must chain to.")
    client_auth: Literal["none", "requested", "required"] = Field(
        default="none", description="Kafka ssl.client.auth: whether clients present a "
        "certificate (mTLS).")
    min_version: TlsVersion = "1.2"
    ciphers: str | None = Field(
        default=None, description="OpenSSL cipher list (TLS 1.2); default: OpenSSL's.")
    reload_seconds: float = Field(
        default=10.0, ge=0, description="How often the files are checked for changes; new "
        "handshakes use the new ones, open connections keep theirs (0: never).")

    @model_validator(mode="after")
    def _client_ca(self) -> ServerTlsConfig:
        if self.client_auth != "none" and self.client_ca_file is None:
            raise ValueError(f"client_auth {self.client_auth} needs client_ca_file")
        return self


class ClientTlsConfig(_Model):
    """TLS toward the brokers."""

    ca_file: str | None = Field(
        default=None, description="PEM: the CAs the brokers' certificates chain to; default: "
        "the system's.")
    cert_file: str | None = Field(default=None, description="PEM: the proxy's own certificate "
                                  "and chain, for brokers that require mTLS.")
    key_file: str | None = None
    key_password_file: str | None = None
    check_hostname: bool = Field(
        default=True, description="Verify that each broker's certificate names the host the "
        "proxy connects to (turning it off is logged as a warning at start).")
    min_version: TlsVersion = "1.2"

    @model_validator(mode="after")
    def _pair(self) -> ClientTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class SaslConfig(_Model):
    """SASL on the client listeners (protocol ``SASL_PLAINTEXT``/``SASL_SSL``)."""

    mode: Literal["inspect", "terminate"] = Field(
        default="inspect", description="inspect: SaslHandshake and SaslAuthenticate go to the "
        "broker; the identity in the client's first message becomes the principal once the "
        "broker answers success. terminate: the proxy authenticates clients itself against "
        "credentials_file and connects to the brokers as upstream.sasl (if set).")
    fallback_principal: str = Field(
        default="ANONYMOUS", min_length=1,
        description="inspect: the principal of clients using a mechanism the proxy cannot read "
        "(GSSAPI, others).")
    oauthbearer_principal_claim: str = Field(
        default="sub", min_length=1, description="inspect: the token claim naming the "
        "principal (Kafka: sasl.oauthbearer.sub.claim.name).")
    oauthbearer_jwks_file: str | None = Field(
        default=None, description="inspect: a JSON Web Key Set: OAUTHBEARER tokens are "
        "verified against it (signature, exp, nbf); without it, the claim is read without "
        "verifying.")
    mechanisms: list[Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]] = Field(
        default=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], min_length=1,
        description="terminate: the mechanisms the proxy offers.")
    credentials_file: str | None = Field(
        default=None, description="terminate: the users' salted SCRAM credentials (written by "
        "`kafka-quota-proxy credentials add`; never passwords), reloaded when it changes.")
    credentials_reload_seconds: float = Field(
        default=10.0, ge=0, description="terminate: how often credentials_file is checked for "
        "changes (0: never).")

    @model_validator(mode="after")
    def _terminate(self) -> SaslConfig:
        if self.mode == "terminate" and self.credentials_file is None:
            raise ValueError("mode terminate needs credentials_file")
        return self


class UpstreamSaslConfig(_Model):
    """The proxy's own identity toward brokers that require SASL, for its own connections
    (metadata refresh, the volume-usage reader); clients' connections carry their own."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str = Field(min_length=1)
    password_file: str = Field(min_length=1, description="A file holding the password.")


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not a network (a CIDR such as 10.0.0.0/24, or an "
                         "address; host names are not resolved)") from None
    return value


class ListenerSecurity(_Model):
    """How clients reach the proxy, the same on every port (the common case)."""

    protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="Kafka security.protocol of the client listeners.")
    tls: ServerTlsConfig | None = None
    ssl_principal_mapping_rules: str | list[str] = Field(
        default="DEFAULT", description="Kafka ssl.principal.mapping.rules: how an mTLS "
        "client's certificate subject becomes its principal.")
    sasl: SaslConfig = SaslConfig()
    proxy_protocol: Literal["none", "v1", "v2", "any"] = Field(
        default="none", description="Connections begin with a PROXY protocol header (from a "
        "load balancer) naming the real client address; one without it is closed.")
    proxy_protocol_trusted_sources: list[Annotated[str, AfterValidator(_network)]] = Field(
        default=[], description="With proxy_protocol (required then): the networks (CIDRs, "
        "e.g. 10.0.0.0/24, or single addresses) of the load balancers allowed to send the "
        "header; a connection from anywhere else is closed before a byte is read "
        "(proxy_header_untrusted_source).")

    @field_validator("ssl_principal_mapping_rules")
    @classmethod
    def _rules(cls, value: str | list[str]) -> str | list[str]:
        PrincipalMapper.parse(value)  # a malformed rule is a ValueError naming it
        return value

    @model_validator(mode="after")
    def _tls_when_ssl(self) -> ListenerSecurity:
        ssl = self.protocol in ("SSL", "SASL_SSL")
        if ssl and self.tls is None:
            raise ValueError(f"protocol {self.protocol} needs tls")
        if not ssl and self.tls is not None:
            raise ValueError(f"tls is set but protocol is {self.protocol}")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.tls is not None

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def terminates_sasl(self) -> bool:
        return self.uses_sasl and self.sasl.mode == "terminate"

    def principal_mapper(self) -> PrincipalMapper:
        return PrincipalMapper.parse(self.ssl_principal_mapping_rules)
