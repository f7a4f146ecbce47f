"""An ACL binding as a record of the compacted ACL topic (``acls.topic``; ``docs/acls.md``).

The key is the whole binding, canonical: a JSON array of its seven fields in Kafka's order,
the enums by name, the host normalised (``normal_host``), written without spaces, UTF-8,
non-ASCII characters as themselves::

    ["TOPIC","orders-","PREFIXED","User:alice","*","WRITE","ALLOW"]

so that a compacted topic keeps exactly one record per binding (two keys for one binding
would let a creation outlive its deletion). A key that is not exactly the canonical encoding
of the binding it names is refused. The value is ``{"v":1}`` for a binding created, None (a
tombstone) for one deleted; any JSON object is read as a creation (fields a later version adds
are ignored).
"""

from __future__ import annotations

import json
from typing import Any

from kafka_quota_proxy.authorizer.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    normal_host,
)

VALUE = b'{"v":1}'
MAX_KEY_BYTES = 1 << 20  # far above any binding Kafka's requests can carry


def normal(binding: AclBinding) -> AclBinding:
    """The binding as its record names it: its host normalised."""
    host = normal_host(binding.host)
    if host == binding.host:
        return binding
    return AclBinding(binding.resource_type, binding.name, binding.pattern_type,
                      binding.principal, host, binding.operation, binding.permission)


def encode_key(binding: AclBinding) -> bytes:
    b = normal(binding)
    return json.dumps([b.resource_type.name, b.name, b.pattern_type.name, b.principal, b.host,
                       b.operation.name, b.permission.name],
                      separators=(",", ":"), ensure_ascii=False).encode()


def encode_record(binding: AclBinding, present: bool) -> tuple[bytes, bytes | None]:
    """``(key, value)``: the value ``{"v":1}`` for a binding created (``present``), None (a
    tombstone) for one deleted. ValueError for a binding that cannot be created
    (``AclBinding.problem``)."""
    problem = binding.problem()
    if problem is not None:
        raise ValueError(f"not a binding to store: {problem}")
    return encode_key(binding), (VALUE if present else None)


def _enum(kind: Any, value: Any, field: str) -> Any:
    if not isinstance(value, str) or value not in kind.__members__:
        raise ValueError(f"{field} {value!r} is not one of Kafka's names")
    return kind[value]


def decode_record(key: bytes | None, value: bytes | None) -> tuple[AclBinding, bool]:
    """``(binding, present)`` from a record of the ACL topic; ValueError for a key that is not
    a canonical binding (malformed, another field order or spacing, a host not normalised),
    a binding with a ``problem()``, or a value that is neither a JSON object nor None."""
    if key is None:
        raise ValueError("the record has no key")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"the key has {len(key)} bytes (at most {MAX_KEY_BYTES})")
    try:
        fields = json.loads(bytes(key).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the key is not JSON: {exc}") from None
    if not isinstance(fields, list) or len(fields) != 7:
        raise ValueError("the key is not an array of the binding's seven fields")
    rtype, name, pattern, principal, host, operation, permission = fields
    for field, text in (("resource name", name), ("principal", principal), ("host", host)):
        if not isinstance(text, str):
            raise ValueError(f"the {field} is not a string")
    binding = AclBinding(_enum(ResourceType, rtype, "resource type"), name,
                         _enum(PatternType, pattern, "pattern type"), principal, host,
                         _enum(AclOperation, operation, "operation"),
                         _enum(AclPermissionType, permission, "permission type"))
    problem = binding.problem()
    if problem is not None:
        raise ValueError(f"the key's binding cannot be stored: {problem}")
    if encode_key(binding) != bytes(key):
        raise ValueError("the key is not the canonical encoding of its binding")
    if value is None:
        return binding, False
    try:
        body = json.loads(bytes(value).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the value is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the value is not a JSON object")
    return binding, True
