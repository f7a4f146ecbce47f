"""``kafka-quota-proxy quotas resolve|simulate``: operators' what-if tools over the same quota
code the proxy runs."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from kafka_quota_proxy.config.schema import QuotaEntityConfig, QuotasConfig
from kafka_quota_proxy.quota.client_quotas import CONTROLLER_MUTATION_RATE
from kafka_quota_proxy.quota.entities import (
    ANONYMOUS,
    EntityKey,
    QuotaType,
    metric_tags,
    quota_limit,
    sharing,
)
from kafka_quota_proxy.quota.manager import QuotaManager, QuotaSettings, percent_of_thread


class EventError(ValueError):
    pass


def resolve_json(quotas: QuotasConfig, user: str, client_id: str) -> dict[str, Any]:
    manager = QuotaManager(quotas.settings())
    out: dict[str, Any] = {"user": user, "client_id": client_id}
    limits: dict[str, float | None] = {}
    for qt in QuotaType:
        r = manager.resolve(qt, user, client_id)
        out[qt.value] = {
            "limit": _number(r.limit),
            "entity": r.entity.path if r.entity else None,
            "level": r.level,
            "shared_by": r.sharing,
        }
        limits[qt.value] = _number(r.limit)
    rates = quotas.mutation_rates()  # KIP-599: per (user, client-id), the same precedence
    tags, level = metric_tags(rates, user, client_id)
    limit, entity = quota_limit(rates, tags) if level is not None else (None, None)
    out[CONTROLLER_MUTATION_RATE] = {
        "limit": _number(limit), "entity": entity.path if entity else None, "level": level,
        "shared_by": sharing(tags)}
    limits[CONTROLLER_MUTATION_RATE] = _number(limit)
    out["limits"] = limits
    return out


def _number(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


def _alter(settings: QuotaSettings, change: Any, line: int) -> QuotaSettings:
    if not isinstance(change, dict) or not isinstance(change.get("entity"), dict):
        raise EventError(f"line {line}: alter needs an 'entity' object")
    to_set = change.get("set", {}) or {}
    to_remove = change.get("remove", []) or []
    if not isinstance(to_set, dict) or not isinstance(to_remove, list):
        raise EventError(f"line {line}: 'set' must be an object and 'remove' a list")
    try:
        probe = QuotaEntityConfig.model_validate(
            {**change["entity"], **(to_set or {"request_percentage": 1})}
        )
    except Exception as exc:
        raise EventError(f"line {line}: invalid alter: {exc}") from None
    key: EntityKey = probe.key()
    entities = {k: dict(v) for k, v in settings.entities.items()}
    current = entities.get(key, {})
    for name in to_remove:
        try:
            current.pop(QuotaType(name), None)  # removing an absent key is a no-op
        except ValueError:
            raise EventError(f"line {line}: unknown quota {name!r}") from None
    if to_set:
        current.update(probe.quotas())
    if current:
        entities[key] = current
    else:
        entities.pop(key, None)
    return dataclasses.replace(settings, entities=entities)


def simulate(quotas: QuotasConfig, events: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Run events (JSON lines, in time order) through the quota engine; yield one result per
    record event."""
    settings = quotas.settings()
    manager = QuotaManager(settings)
    last_t = None
    for line_no, line in enumerate(events, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EventError(f"line {line_no}: not JSON: {exc.msg}") from None
        if not isinstance(event, dict) or not isinstance(event.get("t_ms"), int | float):
            raise EventError(f"line {line_no}: every event needs a numeric 't_ms'")
        t_ms = int(event["t_ms"])
        if last_t is not None and t_ms < last_t:
            raise EventError(f"line {line_no}: events must be in time order")
        last_t = t_ms
        if "alter" in event:
            settings = _alter(settings, event["alter"], line_no)
            manager.update(settings)
            continue
        missing = [k for k in ("quota", "value") if k not in event]
        if missing:
            needed = " and ".join(repr(k) for k in missing)
            raise EventError(f"line {line_no}: a record event needs {needed} (or 'alter' for "
                             "a quota change)")
        try:
            qt = QuotaType.from_short(str(event["quota"]))
        except (KeyError, ValueError):
            known = ", ".join(q.short for q in QuotaType)
            raise EventError(f"line {line_no}: unknown quota {event['quota']!r} (one of "
                             f"{known})") from None
        try:
            value = float(event["value"])
        except (TypeError, ValueError):
            raise EventError(f"line {line_no}: 'value' must be a number, not "
                             f"{event['value']!r}") from None
        user = str(event.get("user") or ANONYMOUS)
        client_id = str(event.get("client_id", ""))
        recorded = percent_of_thread(value) if qt is QuotaType.REQUEST else value
        throttle = manager.record(qt, user, client_id, recorded, t_ms)
        sensor = manager.sensor(qt, user, client_id, t_ms)
        yield {
            "t_ms": t_ms,
            "user": user,
            "client_id": client_id,
            "quota": qt.short,
            "value": _number(value),
            "throttle_ms": throttle,
            "entity": sensor.entity.path if sensor.entity else None,
            "limit": _number(sensor.bound),
        }


def run_simulate(quotas: QuotasConfig, events: IO[str], out: IO[str]) -> int:
    try:
        for result in simulate(quotas, events):
            out.write(json.dumps(result) + "\n")
    except EventError as exc:
        print(f"kafka-quota-proxy quotas simulate: {exc}", file=sys.stderr)
        return 1
    return 0
