"""Tune: recommend quotas from a profile, as seed 000 suggests: defaults for everyone plus
overrides for the top outliers.

- For each byte-rate quota, an entity's demand is its p99 per-second rate on one broker.
- The default (``client-id: <default>``) is ``headroom`` x the ``default_percentile`` of the
  entities' demands: most clients never meet it.
- Entities whose demand is above the default, which would throttle them (at most
  ``max_overrides``, biggest first), get an override of ``headroom`` x their demand.
- With a ``capacity`` per broker (bytes/s), defaults and overrides are scaled down together
  when the entities, each at its quota, would exceed it.
- request_percentage gets a default the same way (from the p99 share of a thread per second).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

DEFAULT_ENTITY = "<default>"


@dataclass(frozen=True)
class TuneOptions:
    headroom: float = 1.5
    default_percentile: float = 0.9
    max_overrides: int = 10
    capacity_bytes: dict[str, float] | None = None  # "produce"/"fetch" -> bytes/s per broker
    min_rate: int = 1024  # never recommend a byte rate below this


KINDS = {"produce": ("produce_rate_p99", "producer_byte_rate"),
         "fetch": ("fetch_rate_p99", "consumer_byte_rate")}


def recommend(profile: pd.DataFrame, options: TuneOptions = TuneOptions()) -> dict[str, Any]:
    """A ``quotas`` config section (window, entities) from an entity profile."""
    default: dict[str, Any] = {"client-id": DEFAULT_ENTITY}
    overrides: dict[str, dict[str, Any]] = {}
    for kind, (column, key) in KINDS.items():
        demand = profile.set_index("client_id")[column].fillna(0.0)
        demand = demand[demand > 0]
        if demand.empty:
            continue
        base = max(options.headroom * float(demand.quantile(options.default_percentile)),
                   options.min_rate)
        above = demand[demand > base].sort_values(ascending=False)  # the default throttles them
        chosen = {cid: max(options.headroom * float(rate), options.min_rate)
                  for cid, rate in above.head(options.max_overrides).items()}
        capacity = (options.capacity_bytes or {}).get(kind)
        if capacity:
            others = len(demand) - len(chosen)
            total = base * others + sum(chosen.values())
            if total > capacity:
                scale = capacity / total
                base *= scale
                chosen = {c: r * scale for c, r in chosen.items()}
        default[key] = int(base)
        for cid, rate in chosen.items():
            if cid == DEFAULT_ENTITY:
                continue
            overrides.setdefault(cid, {"client-id": cid})[key] = int(rate)
    share = profile["request_percentage_p99"].fillna(0.0)
    share = share[share > 0]
    if not share.empty:
        default["request_percentage"] = round(
            max(options.headroom * float(share.quantile(options.default_percentile)), 1.0), 1)
    entities = ([default] if len(default) > 1 else []) + [
        overrides[c] for c in sorted(overrides)]
    return {"window": {"samples": 11, "size_seconds": 1}, "entities": entities}
