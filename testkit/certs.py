"""Certificates made by the tests (trustme): a CA, server certificates for 127.0.0.1, client
certificates with a chosen subject. Nothing secret is committed; every file is made fresh."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import trustme


@dataclass
class Pem:
    cert: Path  # the certificate, then its chain
    key: Path


@dataclass
class Certs:
    directory: Path
    name: str = "test"
    ca: trustme.CA = field(default_factory=lambda: trustme.CA(organization_name="Quota Test CA"))

    @property
    def ca_file(self) -> Path:
        path = self.directory / f"{self.name}-ca.pem"
        if not path.exists():
            self.ca.cert_pem.write_to_path(str(path))
        return path

    def _write(self, stem: str, cert: trustme.LeafCert) -> Pem:
        chain = self.directory / f"{self.name}-{stem}.pem"
        key = self.directory / f"{self.name}-{stem}.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        return Pem(chain, key)

    def server(self, stem: str = "server") -> Pem:
        return self._write(stem, self.ca.issue_cert("127.0.0.1", "localhost"))

    def client(self, common_name: str, unit: str = "clients",
               organization: str = "Example") -> Pem:
        cert = self.ca.issue_cert(f"{common_name}.clients.test", common_name=common_name,
                                  organization_unit_name=unit,
                                  organization_name=organization)
        return self._write(f"client-{common_name}", cert)

    def server_context(self, pem: Pem, client_auth: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(pem.cert), str(pem.key))
        if client_auth:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(str(self.ca_file))
        return ctx

    def client_context(self, pem: Pem | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if pem is not None:
            ctx.load_cert_chain(str(pem.cert), str(pem.key))
        return ctx
