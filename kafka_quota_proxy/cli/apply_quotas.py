"""Recommended quotas written to a cluster with AlterClientQuotas: ``replay --tune --apply``
and ``quotas apply`` (the same, from a report already written).

The recommendation is a ``quotas:`` section (``OUT/recommended-quotas.yaml``, or any file with
one): its ``entities`` (user, client-id or both; ``<default>`` the default entity) become
Kafka's client quota entities as the proxy maps them (``QuotasConfig.static_quotas``: the
default is a null name, as ``--entity-default`` sends it). ``ip_entities`` and ``window`` are
not client quotas AlterClientQuotas sets for user/client-id entities: they are left out, and
live ip entities are neither shown nor touched.

What is live comes from DescribeClientQuotas of every entity (``ClientQuotaFilter.all()``):
through the proxy, the YAML's quotas with the altered ones over them. Per entity and quota
key the diff says

- ``add``: recommended, not set live;
- ``change``: set live to another value;
- ``unchanged``: set live to the recommended value (not sent);
- ``kept``: set live, not in the recommendation: left as it is (a recommendation says what to
  set, not what to remove; ``quotas alter --delete-config`` removes a key).

The additions and changes are sent first with ``validate_only`` (nothing changes; the
cluster's per-entity errors are printed as Kafka's tools print them), then, with ``yes``,
for real; what was applied is printed. Any error exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kafka_quota_proxy.cli.admin_client import (
    AdminConnection,
    CommandConfigError,
    KafkaError,
    load_command_config,
)
from kafka_quota_proxy.cli.admin_tools import (
    QUOTA_KEYS,
    _config_command_failed,
    alter_quota_entries,
    connection_options,
    describe_quotas,
    entity_label,
)
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import load_quotas_config
from kafka_quota_proxy.quota.client_quotas import IP, Entity

REPORT_FILE = "recommended-quotas.yaml"
ADD, CHANGE, UNCHANGED, KEPT = "add", "change", "unchanged", "kept"
Quotas = Mapping[Entity, Mapping[str, float]]


@dataclass(frozen=True)
class KeyDiff:
    """One quota key of one entity: its live value and the recommended one (None: not set
    live / not in the recommendation)."""

    key: str
    current: float | None
    recommended: float | None

    @property
    def kind(self) -> str:
        if self.recommended is None:
            return KEPT
        if self.current is None:
            return ADD
        return UNCHANGED if self.current == self.recommended else CHANGE


@dataclass(frozen=True)
class EntityDiff:
    entity: Entity
    keys: tuple[KeyDiff, ...]

    def ops(self) -> list[tuple[str, float, bool]]:
        """The AlterClientQuotas ops: the additions and changes (nothing is removed)."""
        return [(k.key, k.recommended, False) for k in self.keys
                if k.recommended is not None and k.kind in (ADD, CHANGE)]


def normalized(entity: Sequence[tuple[str, str | None]]) -> Entity:
    """Components sorted by entity type, as the proxy and Kafka key an entity."""
    return tuple(sorted(entity, key=lambda c: c[0]))


def recommended_quotas(path: str | Path) -> dict[Entity, dict[str, float]]:
    """The user / client-id entities of a file's ``quotas:`` section and their quotas (a
    report directory: its ``recommended-quotas.yaml``). ``ConfigError`` when it does not
    load."""
    quotas = load_quotas_config(report_file(path))
    return {normalized(entity): values for entity, values in quotas.static_quotas().items()
            if not _is_ip(entity)}


def report_file(path: str | Path) -> Path:
    """``path``, or a report directory's ``recommended-quotas.yaml``."""
    p = Path(path)
    return p / REPORT_FILE if p.is_dir() else p


def _is_ip(entity: Sequence[tuple[str, str | None]]) -> bool:
    return any(t == IP for t, _ in entity)


def _key_order(key: str) -> tuple[int, str]:
    return (QUOTA_KEYS.index(key) if key in QUOTA_KEYS else len(QUOTA_KEYS), key)


def _entity_order(entity: Entity) -> tuple[int, tuple[tuple[bool, str], ...]]:
    """Users alone, then users with a client-id, then client-ids alone; defaults first."""
    names = dict(entity)
    shape = 2 if "user" not in names else (1 if "client-id" in names else 0)
    return shape, tuple((names[t] is not None, names[t] or "")
                        for t in ("user", "client-id") if t in names)


def diff(current: Quotas, recommended: Quotas) -> list[EntityDiff]:
    """Per entity live or recommended (``_entity_order``), per quota key: live ->
    recommended (the recommended keys, then the kept ones)."""
    live = {normalized(e): v for e, v in current.items() if not _is_ip(e)}
    wanted = {normalized(e): v for e, v in recommended.items()}
    out = []
    for entity in sorted(live.keys() | wanted.keys(), key=_entity_order):
        now, new = live.get(entity, {}), wanted.get(entity, {})
        keys = sorted(new, key=_key_order) + sorted(now.keys() - new.keys(), key=_key_order)
        out.append(EntityDiff(entity, tuple(KeyDiff(k, now.get(k), new.get(k)) for k in keys)))
    return out


def show(value: float | None) -> str:
    """A quota value as the diff prints it (whole numbers without a fraction)."""
    if value is None:
        return "(unset)"
    if float(value).is_integer() and abs(value) < 1e18:
        return str(int(value))
    return repr(float(value))


def format_diff(diffs: Sequence[EntityDiff]) -> list[str]:
    """The diff's lines: one per entity, then one per quota key."""
    lines = []
    width = max((len(k.key) for d in diffs for k in d.keys), default=0)
    for d in diffs:
        lines.append(f"{entity_label(d.entity)}:")
        for k in d.keys:
            if k.kind == KEPT:
                what = f"{show(k.current)}  kept (not in the recommendation)"
            elif k.kind == UNCHANGED:
                what = f"{show(k.current)}  unchanged"
            else:
                what = f"{show(k.current)} -> {show(k.recommended)}  {k.kind}"
            lines.append(f"  {k.key.ljust(width)}  {what}")
    return lines


def counts(diffs: Sequence[EntityDiff]) -> dict[str, int]:
    out = dict.fromkeys((ADD, CHANGE, UNCHANGED, KEPT), 0)
    for d in diffs:
        for k in d.keys:
            out[k.kind] += 1
    return out


def _summary(diffs: Sequence[EntityDiff]) -> str:
    n = counts(diffs)
    return (f"{n[ADD]} to add, {n[CHANGE]} to change, {n[UNCHANGED]} unchanged, {n[KEPT]} "
            "kept (set live, not in the recommendation: left as they are)")


def _entities(n: int) -> str:
    return f"{n} entit{'y' if n == 1 else 'ies'}"


@dataclass
class Outcome:
    diffs: list[EntityDiff]
    refused: list[tuple[Entity, KafkaError]]
    refused_by: str  # "validating" (validate_only: nothing altered) or "altering"
    applied: list[EntityDiff]


async def apply_recommendation(conn: AdminConnection, recommended: Quotas, yes: bool
                               ) -> Outcome:
    """Describe, diff, validate the changes and, with ``yes`` and none refused, alter."""
    found = await describe_quotas(conn, [], strict=False)
    current = {normalized(e): dict(v) for e, v in found if not _is_ip(e)}
    diffs = diff(current, recommended)
    changing = [d for d in diffs if d.ops()]
    outcome = Outcome(diffs, [], "validating", [])
    if not changing:
        return outcome
    entries = [(list(d.entity), d.ops()) for d in changing]
    outcome.refused = _errors(changing, await alter_quota_entries(conn, entries, True))
    if outcome.refused or not yes:
        return outcome
    outcome.refused = _errors(changing, await alter_quota_entries(conn, entries, False))
    outcome.refused_by = "altering"
    failed = {e for e, _ in outcome.refused}
    outcome.applied = [d for d in changing if d.entity not in failed]
    return outcome


def _errors(sent: Sequence[EntityDiff],
            results: Sequence[tuple[Sequence[tuple[str, str | None]], KafkaError | None]]
            ) -> list[tuple[Entity, KafkaError]]:
    """The entities refused (an entity the response leaves out: refused too)."""
    answered = {normalized(e): error for e, error in results}
    out = []
    for d in sent:
        if d.entity not in answered:
            out.append((d.entity, KafkaError("UnknownServerException",
                                             "The response has no result for this entity.")))
        elif (error := answered[d.entity]) is not None:
            out.append((d.entity, error))
    return out


def run_apply(path: str | Path, bootstrap: str, command_config: str | None, yes: bool,
              out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The recommendation of ``path`` applied to the cluster at ``bootstrap`` (a dry run
    unless ``yes``): 0, or 1 on any error."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        recommended = recommended_quotas(path)
    except ConfigError as exc:
        print(f"{report_file(path)}: the recommendation does not load:", file=err)
        for line in exc.errors:
            print(f"  {line}", file=err)
        return 1

    async def work() -> Outcome:
        conn = await AdminConnection.open(bootstrap, load_command_config(command_config),
                                          "alterClientQuotas")
        try:
            return await apply_recommendation(conn, recommended, yes)
        finally:
            await conn.aclose()

    try:
        outcome = asyncio.run(work())
    except (CommandConfigError, KafkaError) as exc:
        return _config_command_failed(exc)
    print(f"client quotas: live at {bootstrap} -> recommended in {report_file(path)}",
          file=out)
    for line in format_diff(outcome.diffs):
        print(line, file=out)
    print(_summary(outcome.diffs), file=out)
    changing = [d for d in outcome.diffs if d.ops()]
    if not changing:
        print("nothing to apply: every recommended quota is already in force", file=out)
        return 0
    for d in outcome.applied:
        done = ", ".join(f"{k}={show(v)}" for k, v, _ in d.ops())
        print(f"applied to {entity_label(d.entity)}: {done}", file=out)
    if outcome.refused:
        for entity, error in outcome.refused:
            print(f"Error while {outcome.refused_by} the quotas of {entity_label(entity)}: "
                  f"{error}", file=err)
        print(f"{len(outcome.refused)} of {_entities(len(changing))} refused"
              + (": nothing altered" if outcome.refused_by == "validating" else ""), file=err)
        return 1
    if yes:
        print(f"applied: {_entities(len(outcome.applied))} altered", file=out)
    else:
        print(f"dry run: validate_only accepted the changes to {_entities(len(changing))}; "
              "nothing altered (--yes applies them)", file=out)
    return 0


def cmd_quotas_apply(args: argparse.Namespace) -> int:
    if not args.bootstrap_server:
        print("--bootstrap-server must be specified.", file=sys.stderr)
        return 1
    return run_apply(args.file, args.bootstrap_server, args.command_config, args.yes)


def register_apply_command(qsub: Any) -> None:
    """``quotas apply`` under the ``quotas`` command."""
    p = qsub.add_parser(
        "apply", help="apply a recommendation (replay --tune's recommended-quotas.yaml) with "
        "AlterClientQuotas: a diff and validate_only, --yes to alter",
        description="Compare the user/client-id quotas of a file's quotas: section (a "
        "report directory: its recommended-quotas.yaml) with those DescribeClientQuotas "
        "reports at --bootstrap-server, per entity and key (add, change, unchanged; keys set "
        "live but not in the file are kept), send the additions and changes with "
        "validate_only, and with --yes alter them (AlterClientQuotas). Exit 1 on any error.")
    p.add_argument("--file", required=True, metavar="FILE|DIR",
                   help="a file with a quotas: section, or a replay --tune report directory")
    connection_options(p)
    p.add_argument("--yes", action="store_true",
                   help="alter for real (default: a dry run, validate_only)")
    p.set_defaults(func=cmd_quotas_apply)
