"""Quota entities, Kafka's 8-level precedence and its sharing rules.

An entity names a user, a client-id, or both; either may be the *default* entity (written
``<default>`` in configuration). The default is a marker, not a name: a client whose id is
literally ``<default>`` is an ordinary client-id (Kafka sanitizes it the same way).

Resolution is per quota type (Kafka keeps one quota manager, and one set of configured
entities, per type), in two steps, as Kafka's ``DefaultQuotaCallback`` does:

1. ``metric_tags``: the first configured level that matches decides which connections share
   one budget (one sensor): levels 1, 2, 4, 5 -> per (user, client-id); 3, 6 -> per user;
   7, 8 and no match -> per client-id.
2. ``quota_limit``: the limit for those tags; ``None`` means unlimited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final


class _Default:
    """The default entity marker (``<default>`` in configuration)."""

    _instance: _Default | None = None

    def __new__(cls) -> _Default:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<default>"

    def __reduce__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()
DEFAULT_NAME: Final = "<default>"
ANONYMOUS: Final = "ANONYMOUS"

Name = str | _Default


class QuotaType(Enum):
    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST = "request_percentage"

    # Members are singletons: identity hashing (in C) instead of Enum's hash of the name (in
    # Python), for the quota budgets' per-request lookups.
    __hash__ = object.__hash__

    @property
    def short(self) -> str:
        return {"producer_byte_rate": "produce", "consumer_byte_rate": "fetch",
                "request_percentage": "request"}[self.value]

    @classmethod
    def from_short(cls, name: str) -> QuotaType:
        for qt in cls:
            if name in (qt.short, qt.value):
                return qt
        raise ValueError(f"unknown quota {name!r} (produce, fetch or request)")


@dataclass(frozen=True, slots=True)
class EntityKey:
    """A configured quota entity. ``None`` = that part is not named."""

    user: Name | None = None
    client_id: Name | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise ValueError("an entity names a user, a client-id, or both")

    @property
    def path(self) -> str:
        """Kafka's configuration path, e.g. ``users/<default>/clients/app-1``."""
        parts = []
        if self.user is not None:
            parts.append(f"users/{self.user if isinstance(self.user, str) else DEFAULT_NAME}")
        if self.client_id is not None:
            cid = self.client_id if isinstance(self.client_id, str) else DEFAULT_NAME
            parts.append(f"clients/{cid}")
        return "/".join(parts)


# Tags of a sensor: (user, client-id), "" where that part does not take part in sharing.
Tags = tuple[str, str]

SHARING = {(True, True): "user+client-id", (True, False): "user", (False, True): "client-id",
           (False, False): "client-id"}


def sharing(tags: Tags) -> str:
    return SHARING[(bool(tags[0]), bool(tags[1]))]


def metric_tags(quotas: Mapping[EntityKey, float], user: str, client_id: str
                ) -> tuple[Tags, int | None]:
    """Which budget a (user, client-id) connection records into, and the level (1-8) that
    matched (``None`` when no configured entity matches)."""
    u, c = user, client_id
    if EntityKey(u, c) in quotas:
        return (u, c), 1
    if EntityKey(u, DEFAULT) in quotas:
        return (u, c), 2
    if EntityKey(u, None) in quotas:
        return (u, ""), 3
    if EntityKey(DEFAULT, c) in quotas:
        return (u, c), 4
    if EntityKey(DEFAULT, DEFAULT) in quotas:
        return (u, c), 5
    if EntityKey(DEFAULT, None) in quotas:
        return (u, ""), 6
    if EntityKey(None, c) in quotas:
        return ("", c), 7
    if EntityKey(None, DEFAULT) in quotas:
        return ("", c), 8
    return ("", c), None


def quota_limit(quotas: Mapping[EntityKey, float], tags: Tags
                ) -> tuple[float | None, EntityKey | None]:
    """The limit that applies to a budget with these tags, and the entity it comes from."""
    u, c = tags
    if u and c:
        candidates = [EntityKey(u, c), EntityKey(u, DEFAULT), EntityKey(DEFAULT, c),
                      EntityKey(DEFAULT, DEFAULT)]
    elif u:
        candidates = [EntityKey(u, None), EntityKey(DEFAULT, None)]
    elif c:
        candidates = [EntityKey(None, c), EntityKey(None, DEFAULT)]
    else:
        # An empty client-id with no user level: Kafka looks up nothing here either.
        candidates = []
    for key in candidates:
        limit = quotas.get(key)
        if limit is not None:
            return limit, key
    return None, None


@dataclass(frozen=True, slots=True)
class Resolution:
    quota_type: QuotaType
    tags: Tags
    level: int | None
    limit: float | None
    entity: EntityKey | None

    @property
    def sharing(self) -> str:
        return sharing(self.tags)


def resolve(quotas: Mapping[EntityKey, float], quota_type: QuotaType, user: str,
            client_id: str) -> Resolution:
    tags, level = metric_tags(quotas, user, client_id)
    limit, entity = quota_limit(quotas, tags)
    return Resolution(quota_type, tags, level, limit, entity)
