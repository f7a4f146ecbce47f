"""The users a proxy that terminates SASL knows: salted SCRAM credentials, never passwords.

The file (YAML, written by ``kafka-quota-proxy credentials add``) holds, per user, one credential
per SCRAM mechanism in Kafka's own text form (``ScramCredentialUtils.credentialToString``, what
``kafka-configs --describe`` shows)::

    users:
      alice:
        SCRAM-SHA-512: "salt=...,stored_key=...,server_key=...,iterations=8192"
        SCRAM-SHA-256: "salt=...,stored_key=...,server_key=...,iterations=8192"

SCRAM clients are checked against the credential of their mechanism. A PLAIN password is
checked against the user's strongest SCRAM credential (the password is salted and hashed as
SCRAM would and compared with the stored key), so one file serves both and holds no password.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any

import yaml

from kafka_quota_proxy.security.scram import (
    MIN_ITERATIONS,
    ScramCredential,
    format_credential,
    make_credential,
    parse_credential,
)

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")  # strongest first (PLAIN uses the first held)
DEFAULT_ITERATIONS = 8192


def _load(text: str) -> object:
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}") from None


@dataclass(frozen=True)
class Credentials:
    """user -> mechanism -> credential."""

    users: dict[str, dict[str, ScramCredential]]

    @classmethod
    def parse(cls, text: str) -> Credentials:
        """The file's text; ValueError naming the user and mechanism that is wrong."""
        doc = _load(text)
        if doc is None:
            doc = {}
        if not isinstance(doc, dict) or set(doc) - {"users"}:
            raise ValueError("a credentials file holds one key, users")
        users = doc.get("users") or {}
        if not isinstance(users, dict):
            raise ValueError("users: expected a mapping of user names")
        out: dict[str, dict[str, ScramCredential]] = {}
        for user, entries in users.items():
            if not isinstance(user, str) or not user:
                raise ValueError(f"users: {user!r} is not a user name")
            if not isinstance(entries, dict) or not entries:
                raise ValueError(f"users.{user}: expected SCRAM-SHA-256 and/or SCRAM-SHA-512")
            held: dict[str, ScramCredential] = {}
            for mechanism, text_value in entries.items():
                if mechanism not in MECHANISMS:
                    raise ValueError(f"users.{user}.{mechanism}: unknown mechanism (expected "
                                     f"{' or '.join(MECHANISMS)})")
                try:
                    credential = parse_credential(str(text_value))
                except ValueError as exc:
                    raise ValueError(f"users.{user}.{mechanism}: {exc}") from None
                if credential.iterations < MIN_ITERATIONS:
                    raise ValueError(f"users.{user}.{mechanism}: iterations "
                                     f"{credential.iterations} is below {MIN_ITERATIONS}")
                held[mechanism] = credential
            out[user] = held
        return cls(out)

    def scram(self, mechanism: str, user: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    def check_plain(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s (against the strongest SCRAM credential held)."""
        held = self.users.get(user)
        if not held:
            return False
        for mechanism in MECHANISMS:
            credential = held.get(mechanism)
            if credential is not None and credential.iterations >= MIN_ITERATIONS:
                candidate = make_credential(mechanism, password, credential.salt,
                                            credential.iterations)
                return hmac.compare_digest(candidate.stored_key, credential.stored_key)
        return False


def add_user(text: str, user: str, password: str,
             iterations: int = DEFAULT_ITERATIONS) -> str:
    """The file's text with ``user`` (re)set to credentials of ``password`` for every SCRAM
    mechanism, each with its own random salt."""
    Credentials.parse(text)  # refuse to extend a broken file
    doc: Any = _load(text)
    users = dict((doc or {}).get("users") or {})
    users[user] = {m: format_credential(make_credential(m, password, os.urandom(24),
                                                       iterations))
                   for m in MECHANISMS}
    return yaml.safe_dump({"users": users}, sort_keys=True)


def remove_user(text: str, user: str) -> str:
    """The file's text without ``user``; KeyError when it holds no such user."""
    Credentials.parse(text)  # refuse to rewrite a broken file
    doc: Any = _load(text)
    users = dict((doc or {}).get("users") or {})
    if user not in users:
        raise KeyError(user)
    del users[user]
    return yaml.safe_dump({"users": users}, sort_keys=True)


def listing(credentials: Credentials) -> list[tuple[str, list[tuple[str, int]]]]:
    """Each user with its mechanisms and their iterations, by name: never a secret (no salt,
    no key)."""
    return [(user, [(m, held[m].iterations) for m in MECHANISMS if m in held])
            for user, held in sorted(credentials.users.items())]


def fingerprint(text: str) -> str:
    """A short digest of a credentials text, for logs (which file version is live)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]
