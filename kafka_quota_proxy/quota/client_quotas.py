"""Kafka's client quota entities and the DescribeClientQuotas / AlterClientQuotas semantics
(KIP-546), on an in-memory map. Pure: the caller owns the map and the record store.

An entity is a tuple of components ``(entity type, name)``, sorted by entity type, each type at
most once; the name ``None`` is the default entity (``<default>``). ``quotas`` maps an entity to
its quota keys and values, as Kafka's ``ClientQuotasImage`` does.

- ``describe`` is ``ClientQuotasImage.describe``: the same validation, errors and matching.
- ``alter`` is ``ClientQuotaControlManager.alterClientQuotas`` (newest version: values must be
  greater than 0; INT and LONG keys must be integral within 1e-6). It returns the per-entity
  results and the changes (Kafka's ``ClientQuotaRecord``); ``apply`` replays them. Validate-only
  is the caller not applying the changes.
- ``encode_record`` / ``decode_record``: one record of the compacted quota topic per entity
  and quota key, so that concurrent alters of different keys do not overwrite each other.

Where Kafka iterates a ``java.util.HashMap`` (the components of an entity, the ops of an
entry), this module follows the same order, so that the first error reported and the entity
printed in a message are Kafka's.

Differences from Kafka, on purpose:

- IP entities must name a literal IPv4 or IPv6 address. Kafka's
  ``InetAddress.getByName`` also accepts a host name and resolves it; this module does no I/O.
  The message is Kafka's: ``<name> is not a valid IP or resolvable host.``
- A value Kafka accepts but that is not a finite number (NaN for any key, +infinity for a
  DOUBLE key) is rejected: ``Quota <k> must be a finite number`` (INVALID_REQUEST). Such a
  value cannot be stored in the quota topic nor enforced.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kafka_quota_proxy.quota.entities import DEFAULT, EntityKey, Name, QuotaType

USER: Final = "user"
CLIENT_ID: Final = "client-id"
IP: Final = "ip"

Component = tuple[str, str | None]
Entity = tuple[Component, ...]
Quotas = Mapping[Entity, Mapping[str, float]]

NONE: Final = 0
UNSUPPORTED_VERSION: Final = 35
INVALID_REQUEST: Final = 42

MATCH_EXACT: Final = 0
MATCH_DEFAULT: Final = 1
MATCH_ANY: Final = 2

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
CONTROLLER_MUTATION_RATE: Final = "controller_mutation_rate"
CONNECTION_CREATION_RATE: Final = "connection_creation_rate"

# Quota key -> ConfigDef type, as QuotaConfig.userAndClientQuotaConfigs() and ipConfigs().
_CLIENT_KEYS: Final = {PRODUCER_BYTE_RATE: "LONG", CONSUMER_BYTE_RATE: "LONG",
                       REQUEST_PERCENTAGE: "DOUBLE", CONTROLLER_MUTATION_RATE: "DOUBLE"}
_IP_KEYS: Final = {CONNECTION_CREATION_RATE: "INT"}
# Integer.MAX_VALUE and Long.MAX_VALUE as Java compares them with a double.
_MAX: Final = {"INT": (2147483647.0, "an INT"), "LONG": (float(2**63), "a LONG")}


class ClientQuotaError(Exception):
    """A request-level error of DescribeClientQuotas: Kafka's error code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class FilterComponent:
    """A DescribeClientQuotas filter component. ``match`` is set only for MATCH_EXACT."""

    entity_type: str
    match_type: int
    match: str | None = None


@dataclass(frozen=True)
class Op:
    """An AlterClientQuotas op. ``value`` is ignored when ``remove`` is set."""

    key: str
    value: float
    remove: bool = False


@dataclass(frozen=True)
class AlterEntry:
    """An AlterClientQuotas entry as sent: the components may be empty or repeat a type."""

    components: tuple[Component, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class AlterResult:
    """One AlterClientQuotas response entry. ``error_message`` is None on success."""

    components: tuple[Component, ...]
    error_code: int
    error_message: str | None


@dataclass(frozen=True)
class Change:
    """One ClientQuotaRecord: set ``key`` of ``entity`` to ``value``; None removes it."""

    entity: Entity
    key: str
    value: float | None


def _sort_key(entity: Entity) -> tuple[tuple[str, bool, str], ...]:
    return tuple((t, n is not None, n or "") for t, n in entity)


_KNOWN_TYPES: Final = frozenset((USER, CLIENT_ID, IP))


def describe(quotas: Quotas, components: Sequence[FilterComponent], strict: bool
             ) -> list[tuple[Entity, dict[str, float]]]:
    """The entities matching the filter and their quotas, sorted by entity, as
    ``ClientQuotasImage.describe``. Raises ``ClientQuotaError`` (INVALID_REQUEST, or
    UNSUPPORTED_VERSION for an unknown entity type) on an invalid filter."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for c in components:
        t = c.entity_type
        if not t:
            raise ClientQuotaError(INVALID_REQUEST, "Invalid empty entity type.")
        if t in exact or t in specified:
            raise ClientQuotaError(
                INVALID_REQUEST, f"Entity type {t} cannot appear more than once in the filter.")
        if t not in _KNOWN_TYPES:
            raise ClientQuotaError(UNSUPPORTED_VERSION, f"Unsupported entity type {t}")
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                raise ClientQuotaError(INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, "
                                       "but set match string to null.")
            exact[t] = c.match
        elif c.match_type == MATCH_DEFAULT:
            if c.match is not None:
                raise ClientQuotaError(INVALID_REQUEST, "Request specified MATCH_TYPE_DEFAULT, "
                                       "but also specified a match string.")
            exact[t] = None
        elif c.match_type == MATCH_ANY:
            if c.match is not None:
                raise ClientQuotaError(INVALID_REQUEST, "Request specified "
                                       "MATCH_TYPE_SPECIFIED, but also specified a match string.")
            specified.add(t)
        else:
            raise ClientQuotaError(INVALID_REQUEST, f"Unknown match type {c.match_type}")
    used = exact.keys() | specified
    if IP in used and (USER in used or CLIENT_ID in used):
        raise ClientQuotaError(
            INVALID_REQUEST, "Invalid entity filter component combination. IP filter component "
            "should not be used with user or clientId filter component.")

    found = []
    for entity, values in quotas.items():
        names = dict(entity)
        if strict and len(names) != len(exact) + len(specified):
            continue
        # "Any specified name" is "type present": Kafka does not exclude the default name.
        if (all(t in names and names[t] == n for t, n in exact.items())
                and all(t in names for t in specified)):
            found.append((entity, dict(values)))
    found.sort(key=lambda item: _sort_key(item[0]))
    return found


def alter(quotas: Quotas, entries: Sequence[AlterEntry]
          ) -> tuple[list[AlterResult], list[Change]]:
    """Validate the entries in request order as ``ClientQuotaControlManager.alterClientQuotas``.

    Returns one result per distinct entity (first-seen order) and the changes of the accepted
    entities, only where a value differs or a set key is removed. As in Kafka, an entity that
    appears again in a later entry gets "Ignoring duplicate entity", while the changes of its
    first entry stay. ``quotas`` is not modified.
    """
    results: dict[Entity, AlterResult] = {}
    changes: list[Change] = []
    for entry in entries:
        names: dict[str, str | None] = {}
        for t, n in entry.components:  # AlterClientQuotasRequest.entries(): last one wins
            names[t] = n
        entity: Entity = tuple(sorted(names.items(), key=lambda c: c[0]))
        ops: dict[str, float | None] = {}
        duplicate_key = False
        for op in entry.ops:
            if op.key in ops:
                duplicate_key = True  # "Duplicate quota key ...", overwritten just below
            else:
                ops[op.key] = None if op.remove else op.value
        if duplicate_key or entity in results:
            message = f"Ignoring duplicate entity {_entity_str(names, len(entry.components))}"
            results[entity] = AlterResult(entity, INVALID_REQUEST, message)
            continue
        error, new = _alter_entity(quotas.get(entity, {}), entity, names,
                                   len(entry.components), ops)
        if error is None:
            changes.extend(new)
            results[entity] = AlterResult(entity, NONE, None)
        else:
            results[entity] = AlterResult(entity, INVALID_REQUEST, error)
    return list(results.values()), changes


def _alter_entity(current: Mapping[str, float], entity: Entity, names: dict[str, str | None],
                  wire_size: int, ops: dict[str, float | None]
                  ) -> tuple[str | None, list[Change]]:
    """``alterClientQuotaEntity``: the error message, or None and the changes."""
    # validateEntity
    if not names:
        return "Invalid empty client quota entity", []
    for t in _java_hash_map_order(list(names), wire_size):
        if t not in _KNOWN_TYPES:
            return f"Unhandled client quota entity type: {t}", []
        if names[t] == "":
            return f"Empty {t} not supported", []
    # configKeysForEntityType
    if IP in names:
        if USER in names or CLIENT_ID in names:
            return ("Invalid quota entity combination, IP entity should"
                    "not be combined with User or ClientId"), []
        address = names[IP]
        if address is not None and not _is_ip_literal(address):
            return f"{address} is not a valid IP or resolvable host.", []
        config_keys = _IP_KEYS
    else:
        config_keys = _CLIENT_KEYS
    new = []
    for key in _java_hash_map_order(list(ops), len(ops)):
        value = ops[key]
        if value is None:
            if key in current:
                new.append(Change(entity, key, None))
            continue
        error = _validate_quota_value(config_keys, key, value)
        if error is not None:
            return error, []
        if current.get(key) != value:
            new.append(Change(entity, key, value))
    return None, new


def _validate_quota_value(config_keys: Mapping[str, str], key: str, value: float) -> str | None:
    """``validateQuotaKeyValue`` and ``getErrorForIntegralQuotaValue``, then finiteness."""
    kind = config_keys.get(key)
    if kind is None:
        return f"Invalid configuration key {key}"
    if value <= 0.0:
        return f"Quota {key} must be greater than 0"
    if kind in _MAX:
        limit, name = _MAX[kind]
        if value > limit:
            return f"Proposed value for {key} is too large for {name}."
        if abs(math.fmod(value, 1.0)) > 1e-6:
            return f"{key} cannot be a fractional value."
    if not math.isfinite(value):  # not Kafka: NaN and +inf pass Kafka's checks
        return f"Quota {key} must be a finite number"
    return None


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _java_hash(s: str) -> int:
    """``String.hashCode`` (over UTF-16 code units), as an unsigned 32-bit int."""
    h = 0
    units = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h


def _java_hash_map_order(keys: list[str], initial_capacity: int) -> list[str]:
    """The iteration order of ``new HashMap<>(initial_capacity)`` after putting these distinct
    keys in this order: by bucket, then by insertion (exact for small maps: no treeified bin)."""
    capacity = 1
    while capacity < initial_capacity:
        capacity *= 2
    threshold = int(capacity * 0.75)
    for size in range(1, len(keys) + 1):
        if size > threshold:
            capacity *= 2
            threshold = int(capacity * 0.75)

    def bucket(key: str) -> int:
        h = _java_hash(key)
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(keys, key=bucket)


def _entity_str(names: dict[str, str | None], wire_size: int) -> str:
    """``ClientQuotaEntity.toString`` of the entity as the request built it."""
    order = _java_hash_map_order(list(names), wire_size)
    inner = ", ".join(f"{t}={'null' if names[t] is None else names[t]}" for t in order)
    return f"ClientQuotaEntity(entries={{{inner}}})"


def apply(quotas: Quotas, changes: Iterable[Change]) -> dict[Entity, dict[str, float]]:
    """A new map with the changes replayed (``ClientQuotaControlManager.replay``): an entity
    whose last key is removed disappears."""
    out = {entity: dict(values) for entity, values in quotas.items()}
    for c in changes:
        if c.value is None:
            values = out.get(c.entity)
            if values is not None:
                values.pop(c.key, None)
                if not values:
                    del out[c.entity]
        else:
            out.setdefault(c.entity, {})[c.key] = c.value
    return out


def _entity_kind(entity: Entity) -> str:
    """``IP`` or ``USER`` (user, client-id or both) for an entity Kafka accepts; else
    ``ValueError``. An IP name is not checked here."""
    if not isinstance(entity, tuple) or not entity:
        raise ValueError(f"invalid client quota entity {entity!r}: empty")
    types = []
    for component in entity:
        if (not isinstance(component, tuple) or len(component) != 2
                or not isinstance(component[0], str)):
            raise ValueError(f"invalid client quota entity {entity!r}: bad component")
        t, n = component
        if t not in (USER, CLIENT_ID, IP):
            raise ValueError(f"invalid client quota entity {entity!r}: unknown type {t!r}")
        if n is not None and (not isinstance(n, str) or not n):
            raise ValueError(f"invalid client quota entity {entity!r}: bad {t} name")
        types.append(t)
    if types != sorted(set(types)):
        raise ValueError(f"invalid client quota entity {entity!r}: types not sorted or repeated")
    if IP in types:
        if len(types) > 1:
            raise ValueError(f"invalid client quota entity {entity!r}: ip with user/client-id")
        return IP
    return USER


def keys_for(entity: Entity) -> frozenset[str]:
    """The quota keys of an entity (``QuotaConfig``): user, client-id or both ->
    producer_byte_rate, consumer_byte_rate, request_percentage, controller_mutation_rate;
    ip -> connection_creation_rate. ``ValueError`` for an entity Kafka rejects."""
    return frozenset(_IP_KEYS if _entity_kind(entity) == IP else _CLIENT_KEYS)


def entity_key(entity: Entity) -> EntityKey | None:
    """The ``EntityKey`` of a user / client-id entity (default name -> ``DEFAULT``); None for an
    ip entity. ``ValueError`` for an entity Kafka rejects."""
    if _entity_kind(entity) == IP:
        return None
    names = dict(entity)

    def part(t: str) -> Name | None:
        if t not in names:
            return None
        n = names[t]
        return DEFAULT if n is None else n

    return EntityKey(user=part(USER), client_id=part(CLIENT_ID))


def from_entity_key(key: EntityKey) -> Entity:
    """The entity of an ``EntityKey``: the inverse of ``entity_key``."""
    parts: list[Component] = []
    if key.client_id is not None:
        parts.append((CLIENT_ID, key.client_id if isinstance(key.client_id, str) else None))
    if key.user is not None:
        parts.append((USER, key.user if isinstance(key.user, str) else None))
    return tuple(parts)


def byte_rate_quotas(quotas: Quotas) -> dict[QuotaType, dict[EntityKey, float]]:
    """Per ``QuotaType`` (every type present, maybe empty), the configured user / client-id
    entities, as ``quota.entities.resolve`` takes them. ip entities and other keys are left
    out."""
    out: dict[QuotaType, dict[EntityKey, float]] = {qt: {} for qt in QuotaType}
    for entity, values in quotas.items():
        key = entity_key(entity)
        if key is None:
            continue
        for qt in QuotaType:
            value = values.get(qt.value)
            if value is not None:
                out[qt][key] = value
    return out


# The quota topic: key {"entity":[[type,name],...],"key":k} (compact, canonical: sorted by
# type, name null = default), value {"value":v}, or no value (a tombstone) for a removal.

def _check_change(entity: Entity, key: Any, value: Any) -> None:
    if _entity_kind(entity) == IP:
        address = entity[0][1]
        if address is not None and not _is_ip_literal(address):
            raise ValueError(f"invalid client quota entity {entity!r}: {address!r} is not an IP")
    if not isinstance(key, str) or not key:
        raise ValueError(f"invalid quota key {key!r}")
    if value is None:
        return  # a tombstone may remove any key
    if key not in keys_for(entity):
        raise ValueError(f"quota key {key!r} is not valid for entity {entity!r}")
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"quota {key} value {value!r} is not a finite number greater than 0")


def _record_key(change: Change) -> bytes:
    doc = {"entity": [[t, n] for t, n in change.entity], "key": change.key}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_record(change: Change) -> tuple[bytes, bytes | None]:
    """The quota-topic record of a change: (key, value), value None for a removal.
    ``ValueError`` for a change ``decode_record`` would not accept."""
    _check_change(change.entity, change.key, change.value)
    if change.value is None:
        return _record_key(change), None
    value = json.dumps({"value": float(change.value)}, separators=(",", ":"), allow_nan=False)
    return _record_key(change), value.encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate field")
    return out


def _load(data: bytes, what: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"client quota record {what} is not valid JSON: {e}") from None


def decode_record(key: bytes, value: bytes | None) -> Change:
    """The change a quota-topic record carries. ``ValueError`` on anything malformed: not
    JSON, other fields, an entity Kafka rejects, a key not in canonical form, a value that is
    not a finite number greater than 0."""
    doc = _load(key, "key")
    if not isinstance(doc, dict) or set(doc) != {"entity", "key"}:
        raise ValueError(f"client quota record key {key!r}: expected fields entity and key")
    raw = doc["entity"]
    if not isinstance(raw, list) or not all(isinstance(c, list) and len(c) == 2 for c in raw):
        raise ValueError(f"client quota record key {key!r}: entity is not [[type, name], ...]")
    entity: Entity = tuple((c[0], c[1]) for c in raw)
    number: Any = None
    if value is not None:
        vdoc = _load(value, "value")
        if not isinstance(vdoc, dict) or set(vdoc) != {"value"}:
            raise ValueError(f"client quota record value {value!r}: expected field value only")
        number = vdoc["value"]
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"client quota record value {value!r}: value is not a number")
        try:
            number = float(number)
        except OverflowError:
            raise ValueError(f"client quota record value {value!r}: value too large") from None
    _check_change(entity, doc["key"], number)
    change = Change(entity, doc["key"], number)
    if _record_key(change) != key:
        raise ValueError(f"client quota record key {key!r} is not in canonical form")
    return change
