"""``kafka-quota-proxy quotas describe|alter`` and ``kafka-quota-proxy acls``: Kafka's
``kafka-configs.sh`` (client quotas) and ``kafka-acls.sh`` in Python, against any bootstrap
(the proxy, or a Kafka broker), with those tools' options, output and error texts
(Kafka's ``ConfigCommand`` and ``AclCommand``).

They speak the wire protocol themselves (``cli.admin_client``): DescribeClientQuotas (48),
AlterClientQuotas (49), DescribeAcls (29), CreateAcls (30), DeleteAcls (31), at the highest
version both sides know. What differs from Kafka's tools: no ZooKeeper or controller
bootstrap, no SCRAM credential configs (``credentials add`` manages the proxy's users), no
``--producer``/``--consumer`` shortcuts; sets print in the order given or answered (Kafka's
print in hash order); a Java stack trace is its exception lines only.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import re
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kio.index import load_request_schema

from kafka_quota_proxy.authorizer.acls import (
    CLUSTER_NAME,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kafka_quota_proxy.cli.admin_client import (
    AdminConnection,
    CommandConfigError,
    KafkaError,
    error_for,
    load_command_config,
)

T = TypeVar("T")

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31

QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage",
              "controller_mutation_rate")  # QuotaConfig.isClientOrUserQuotaConfig
IP_KEYS = ("connection_creation_rate",)  # DynamicConfig.Ip.names
SCRAM_KEYS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ENTITY_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
_LABELS = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


class UsageError(Exception):
    """What Kafka's tools print alone (an IllegalArgumentException, a usage error), exit 1."""


def java_double(value: float) -> str:
    """``java.lang.Double.toString``: ``1048576.0``, ``1.0E7``, ``1.0E-4``."""
    import decimal

    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if str(value).startswith("-") else ""
    if value == 0:
        return sign + "0.0"
    digits_tuple = decimal.Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple.digits))
    exponent = len(digits) + int(digits_tuple.exponent) - 1  # of the first digit
    if 1e-3 <= abs(value) < 1e7:
        if exponent < 0:
            return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
        whole, frac = digits[:exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1:]
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _run(make: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await make()

    return asyncio.run(main())


async def _connected(args: argparse.Namespace, call: str,
                     work: Callable[[AdminConnection], Awaitable[T]]) -> T:
    settings = load_command_config(args.command_config)
    conn = await AdminConnection.open(args.bootstrap_server, settings, call)
    try:
        return await work(conn)
    finally:
        await conn.aclose()


def _module(api_key: int, version: int) -> Any:
    return __import__(load_request_schema(api_key, version).__module__, fromlist=["_"])


# ================================================================== client quotas
_SPLIT_COMMA = re.compile(r",(?=[^\]]*(?:\[|$))")
_SPLIT_EQUALS = re.compile(r"\s*=\s*(?=[^\]]*(?:\[|$))")


def parse_add_config(text: str) -> dict[str, str]:
    """``--add-config`` as ``ConfigCommand.parseConfigsToBeAdded`` reads it: ``k=v,...``,
    square brackets grouping a value with commas."""
    props: dict[str, str] = {}
    pairs = [_SPLIT_EQUALS.split(part) for part in _SPLIT_COMMA.split(text)]
    if not all(len(p) == 2 for p in pairs):
        raise UsageError('Invalid entity config: all configs to be added must be in the format '
                         '"key=val" or  "key=[val1,val2]" to group values which contain '
                         'commas.')
    for key, value in pairs:
        props[key.strip()] = re.sub(r"\[?\]?", "", value).strip()
    for key in props:
        if not re.fullmatch(r"[a-zA-Z0-9._-]*", key):
            raise UsageError(f"Invalid character found for config key: {key}")
    return props


def parse_delete_config(values: Sequence[str] | None) -> list[str]:
    """``--delete-config k1,k2`` (repeatable)."""
    return [k.strip() for v in values or () for k in v.split(",")]


def _scala(kind: str, items: Sequence[str]) -> str:
    return f"{kind}({', '.join(items)})"


@dataclass(frozen=True)
class QuotaEntity:
    """``--entity-type`` and ``--entity-name``/``--entity-default`` paired in order
    (``""``: the default entity)."""

    types: tuple[str, ...]
    names: tuple[str, ...]

    def components(self) -> list[tuple[str, int, str | None]]:
        """A DescribeClientQuotas filter (``ClientQuotaFilter.containsOnly``)."""
        out: list[tuple[str, int, str | None]] = []
        for i, kind in enumerate(self.types):
            entity_type = ENTITY_TYPES[kind]
            if i >= len(self.names):
                out.append((entity_type, MATCH_SPECIFIED, None))
            elif self.names[i] == "":
                out.append((entity_type, MATCH_DEFAULT, None))
            else:
                out.append((entity_type, MATCH_EXACT, self.names[i]))
        return out

    def alter_entity(self) -> list[tuple[str, str | None]]:
        return [(ENTITY_TYPES[t], n or None) for t, n in zip(self.types, self.names,
                                                               strict=True)]

    def completed(self) -> str:
        if self.names[0]:
            return f"Completed updating config for {self.types[0][:-1]} {self.names[0]}."
        return f"Completed updating default config for {self.types[0]} in the cluster."


def check_quota_args(args: argparse.Namespace, alter: bool) -> QuotaEntity:
    """``ConfigCommandOptions.checkArgs`` for client quotas (UsageError with Kafka's text)."""
    if not args.bootstrap_server:
        raise UsageError("--bootstrap-server must be specified.")
    types = tuple(args.entity_types or ())
    names = tuple(args.entity_names or ())
    duplicates = [t for i, t in enumerate(types) if t in types[:i]]
    if duplicates:
        raise UsageError(f"Duplicate entity type(s) specified: {','.join(duplicates)}")
    for kind in types:
        if kind not in ENTITY_TYPES:
            raise UsageError(f"Invalid entity type {kind}, the entity type must be one of "
                             f"{', '.join(ENTITY_TYPES)} with a --bootstrap-server argument")
    if not types:
        raise UsageError("At least one entity type must be specified")
    if len(types) > 1 and set(types) != {"users", "clients"}:
        raise UsageError("Only 'users' and 'clients' entity types may be specified together")
    if "ips" in types:
        for name in names:
            if name and not _valid_ip_entity(name):
                raise UsageError(f"The entity name for {types[0]} must be a valid IP or "
                                 f"resolvable host, but it is: {name}")
    if len(names) > len(types):
        raise UsageError("More entity names specified than entity types")
    if alter:
        if not names:
            raise UsageError("An entity-name or default entity must be specified with --alter "
                             "of users, clients, brokers or ips")
        if not args.add_config and not args.delete_config:
            raise UsageError("At least one of --add-config, --add-config-file, or "
                             "--delete-config must be specified with --alter")
        if len(types) != len(names):
            raise UsageError("An entity name must be specified for every entity type")
    return QuotaEntity(types, names)


def _valid_ip_entity(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def alter_ops(entity: QuotaEntity, adds: dict[str, str], deletes: Sequence[str]
              ) -> list[tuple[str, float, bool]]:
    """The AlterClientQuotas ops of ``--add-config``/``--delete-config``, checked as
    ``ConfigCommand.alterConfig`` checks them."""
    head = entity.types[0]
    if head == "ips":
        unknown = [k for k in [*adds, *deletes] if k not in IP_KEYS]
        if unknown:
            raise UsageError("Only connection quota configs can be added for 'ips' using "
                             f"--bootstrap-server. Unexpected config names: {','.join(unknown)}")
    else:
        unknown_adds = [k for k in adds if k not in QUOTA_KEYS and k not in SCRAM_KEYS]
        scram_adds = [k for k in adds if k in SCRAM_KEYS]
        unknown_deletes = [k for k in deletes if k not in QUOTA_KEYS and k not in SCRAM_KEYS]
        scram_deletes = [k for k in deletes if k in SCRAM_KEYS]
        if head == "clients" or len(entity.types) == 2:
            if unknown_adds or scram_adds:
                raise UsageError("Only quota configs can be added for 'clients' using "
                                 "--bootstrap-server. Unexpected config names: "
                                 + _scala("Set", unknown_adds + scram_adds))
            if unknown_deletes or scram_deletes:
                raise UsageError("Only quota configs can be deleted for 'clients' using "
                                 "--bootstrap-server. Unexpected config names: "
                                 + _scala("ArrayBuffer", unknown_deletes + scram_deletes))
        else:
            if unknown_adds:
                raise UsageError("Only quota and SCRAM credential configs can be added for "
                                 "'users' using --bootstrap-server. Unexpected config names: "
                                 + _scala("Set", unknown_adds))
            if unknown_deletes:
                raise UsageError("Only quota and SCRAM credential configs can be deleted for "
                                 "'users' using --bootstrap-server. Unexpected config names: "
                                 + _scala("ArrayBuffer", unknown_deletes))
            if scram_adds or scram_deletes:
                raise UsageError("SCRAM credential configs are not altered by this tool: the "
                                 "proxy's users are managed with kafka-quota-proxy credentials")
    ops: list[tuple[str, float, bool]] = []
    for key, value in adds.items():
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"Cannot parse quota configuration value for {key}: {value}"
                             ) from None
        ops.append((key, number, False))
    ops.extend((key, 0.0, True) for key in deletes)
    return ops


def format_quotas(entity: Sequence[tuple[str, str | None]],
                  values: Sequence[tuple[str, float]]) -> str:
    """One line of ``kafka-configs.sh --describe`` for a client quota entity."""
    listed = ", ".join(f"{k}={java_double(v)}" for k, v in values)
    return f"Quota configs for {entity_label(entity)} are {listed}"


def entity_label(entity: Sequence[tuple[str, str | None]]) -> str:
    """A client quota entity as ``kafka-configs.sh`` names it: ``user-principal 'alice',
    client-id 'app'``, ``the default user-principal``."""
    names = dict(entity)
    parts = []
    for entity_type in ("user", "client-id", "ip"):
        if entity_type in names:
            name = names[entity_type]
            label = _LABELS[entity_type]
            parts.append(f"{label} '{name}'" if name is not None else f"the default {label}")
    return ", ".join(parts)


async def describe_quotas(conn: AdminConnection, components: Sequence[tuple[str, int, str | None]],
                          strict: bool = True
                          ) -> list[tuple[list[tuple[str, str | None]], list[tuple[str, float]]]]:
    """The entities matching the filter and their quotas (no components and not ``strict``:
    every entity, as ``ClientQuotaFilter.all()``)."""
    version = conn.version(DESCRIBE_CLIENT_QUOTAS)
    mod = _module(DESCRIBE_CLIENT_QUOTAS, version)
    response = await conn.roundtrip(
        DESCRIBE_CLIENT_QUOTAS, version, strict=strict,
        components=tuple(mod.ComponentData(entity_type=t, match_type=m, match=n)
                         for t, m, n in components))
    if int(response.error_code):
        raise error_for(int(response.error_code), response.error_message)
    return [([(str(e.entity_type), e.entity_name) for e in entry.entity],
             [(str(v.key), float(v.value)) for v in entry.values])
            for entry in response.entries or ()]


async def alter_quotas(conn: AdminConnection, entity: Sequence[tuple[str, str | None]],
                       ops: Sequence[tuple[str, float, bool]]) -> None:
    for _, error in await alter_quota_entries(conn, [(entity, ops)]):
        if error is not None:
            raise error


QuotaAlteration = tuple[Sequence[tuple[str, str | None]], Sequence[tuple[str, float, bool]]]


async def alter_quota_entries(conn: AdminConnection, entries: Sequence[QuotaAlteration],
                              validate_only: bool = False
                              ) -> list[tuple[list[tuple[str, str | None]], KafkaError | None]]:
    """One AlterClientQuotas request of several entities (each: its components and its ops
    ``(key, value, remove)``): per entity of the response, the error it got (None: done, or
    valid with ``validate_only``)."""
    version = conn.version(ALTER_CLIENT_QUOTAS)
    mod = _module(ALTER_CLIENT_QUOTAS, version)
    response = await conn.roundtrip(
        ALTER_CLIENT_QUOTAS, version, validate_only=validate_only, entries=tuple(mod.EntryData(
            entity=tuple(mod.EntityData(entity_type=t, entity_name=n) for t, n in entity),
            ops=tuple(mod.OpData(key=k, value=v, remove=r) for k, v, r in ops))
            for entity, ops in entries))
    return [([(str(e.entity_type), e.entity_name) for e in result.entity],
             error_for(int(result.error_code), result.error_message)
             if int(result.error_code) else None)
            for result in response.entries]


def _command_line() -> str:
    return " ".join(sys.argv[1:])


def _config_command_failed(exc: Exception) -> int:
    """As ``ConfigCommand.main`` prints a failure (to stderr), exit 1."""
    if isinstance(exc, UsageError | CommandConfigError):
        print(exc, file=sys.stderr)
        return 1
    print(f"Error while executing config command with args '{_command_line()}'",
          file=sys.stderr)
    print(f"java.util.concurrent.ExecutionException: {exc}", file=sys.stderr)
    print(f"Caused by: {exc}", file=sys.stderr)
    if isinstance(exc, KafkaError) and exc.cause:
        print(f"Caused by: {exc.cause}", file=sys.stderr)
    return 1


def cmd_quotas_describe(args: argparse.Namespace) -> int:
    try:
        entity = check_quota_args(args, alter=False)

        async def work(conn: AdminConnection) -> list[str]:
            found = await describe_quotas(conn, entity.components())
            return [format_quotas(e, v) for e, v in found]

        lines = _run(lambda: _connected(args, "describeClientQuotas", work))
    except (UsageError, CommandConfigError, KafkaError) as exc:
        return _config_command_failed(exc)
    for line in lines:
        print(line)
    return 0


def cmd_quotas_alter(args: argparse.Namespace) -> int:
    try:
        entity = check_quota_args(args, alter=True)
        adds = parse_add_config(args.add_config) if args.add_config else {}
        deletes = parse_delete_config(args.delete_config)
        ops = alter_ops(entity, adds, deletes)

        async def work(conn: AdminConnection) -> None:
            if deletes:  # Kafka's tool refuses to delete what is not set
                current = await describe_quotas(conn, entity.components())
                keys = {k for k, _ in current[0][1]} if current else set()
                missing = [k for k in deletes if k not in keys]
                if missing:
                    raise UsageError(f"Invalid config(s): {','.join(missing)}")
            await alter_quotas(conn, entity.alter_entity(), ops)

        _run(lambda: _connected(args, "alterClientQuotas", work))
    except (UsageError, CommandConfigError, KafkaError) as exc:
        return _config_command_failed(exc)
    print(entity.completed())
    return 0


# ================================================================== ACLs
_OPERATIONS_OF = {
    ResourceType.TOPIC: ("READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER",
                         "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    ResourceType.GROUP: ("READ", "DESCRIBE", "DELETE"),
    ResourceType.CLUSTER: ("CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
                           "IDEMPOTENT_WRITE", "ALTER", "DESCRIBE"),
    ResourceType.TRANSACTIONAL_ID: ("DESCRIBE", "WRITE"),
}  # AclEntry.supportedOperations

Pattern = tuple[ResourceType, str | None, PatternType]
Entry = tuple[str, str, AclOperation, AclPermissionType]  # principal, host, operation, perm


class AclCommandError(Exception):
    """A failure ``AclCommand.main`` reports with its stack trace (``lines``)."""

    def __init__(self, message: str, lines: Sequence[str]) -> None:
        super().__init__(message)
        self.lines = list(lines)


def _illegal(message: str) -> AclCommandError:
    return AclCommandError(message, [f"java.lang.IllegalArgumentException: {message}"])


def pattern_str(pattern: Pattern) -> str:
    """``ResourcePattern.toString`` (and ``ResourcePatternFilter``'s)."""
    rtype, name, ptype = pattern
    return (f"ResourcePattern(resourceType={rtype.name}, "
            f"name={'<any>' if name is None else name}, patternType={ptype.name})")


def entry_str(entry: Entry) -> str:
    """``AccessControlEntry.toString``."""
    principal, host, op, perm = entry
    return (f"(principal={principal}, host={host}, operation={op.name}, "
            f"permissionType={perm.name})")


def parse_operation(name: str) -> AclOperation:
    """``SecurityUtils.operation``: ``Read``, ``READ``, ``DescribeConfigs`` (and
    ``describe_configs``)."""
    key = name.strip().replace("_", "").replace("-", "").upper()
    for op in AclOperation:
        if op.name.replace("_", "") == key and op not in (AclOperation.UNKNOWN,
                                                          AclOperation.ANY):
            return op
    raise _illegal(f"Unknown operation name {name.strip()}")


def parse_pattern_type(text: str) -> PatternType:
    try:
        kind = PatternType[text.strip().upper()]
    except KeyError:
        kind = PatternType.UNKNOWN
    if kind is PatternType.UNKNOWN:
        raise UsageError(f"Unknown resource-pattern-type: {text}")
    return kind


def _principal(text: str) -> str:
    kind, sep, name = text.strip().partition(":")
    if not sep or not kind or not name:
        raise _illegal("expected a string in format principalType:principalName but got "
                       f"{text.strip()}")
    return f"{kind}:{name}"


def _unique(items: Sequence[T]) -> list[T]:
    return list(dict.fromkeys(items))


def check_acl_args(args: argparse.Namespace) -> str:
    """``AclCommandOptions.checkArgs``: the action (UsageError with Kafka's text)."""
    if not args.bootstrap_server:
        raise UsageError("--bootstrap-server must be specified")
    actions = [a for a in ("add", "remove", "list") if getattr(args, a)]
    if len(actions) != 1:
        raise UsageError("Command must include exactly one action: --list, --add, --remove. ")
    if args.list:
        for option in ("allow_host", "allow_principal", "deny_host", "deny_principal"):
            if getattr(args, option):
                raise UsageError(f'Option "[list]" can\'t be used with option '
                                 f'"[{option.replace("_", "-")}]"')
    if args.principal and not args.list:
        raise UsageError("The --principal option is only available if --list is set")
    return actions[0]


def resource_filters(args: argparse.Namespace, required: bool) -> list[Pattern]:
    """``AclCommand.getResourceFilter``."""
    kind = parse_pattern_type(args.resource_pattern_type)
    filters: list[Pattern] = [(ResourceType.TOPIC, t.strip(), kind) for t in args.topic or ()]
    if kind is PatternType.LITERAL and args.cluster:
        filters.append((ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    filters += [(ResourceType.GROUP, g.strip(), kind) for g in args.group or ()]
    filters += [(ResourceType.TRANSACTIONAL_ID, t, kind) for t in args.transactional_id or ()]
    if not filters and required:
        raise UsageError("You must provide at least one resource: --topic <topic> or --cluster "
                         "or --group <group> or --delegation-token <Delegation Token ID>")
    return _unique(filters)


def acl_entries(args: argparse.Namespace) -> list[Entry]:
    """``AclCommand.getAcl``: every principal x operation x host given, allowed and denied."""
    operations = _unique([parse_operation(o) for o in args.operation or ["All"]])
    out: list[Entry] = []
    for principals, hosts, perm in (
            (args.allow_principal, args.allow_host, AclPermissionType.ALLOW),
            (args.deny_principal, args.deny_host, AclPermissionType.DENY)):
        named = _unique([_principal(p) for p in principals or ()])
        if not named:
            continue
        for principal in named:
            for op in operations:
                for host in _unique([h.strip() for h in hosts or ["*"]]):
                    out.append((principal, host, op, perm))
    return out


def _validate_operations(filters: Sequence[Pattern], entries: Sequence[Entry]) -> None:
    for rtype, _, _ in filters:
        valid = [*_OPERATIONS_OF.get(rtype, ()), "ALL"]
        if any(op.name not in valid for _, _, op, _ in entries):
            raise UsageError(f"ResourceType {rtype.name} only supports operations "
                             f"[{', '.join(valid)}]")


def _acl_failure(exc: KafkaError) -> AclCommandError:
    lines = [f"java.util.concurrent.ExecutionException: {exc}", f"Caused by: {exc}"]
    if exc.cause:
        lines.append(f"Caused by: {exc.cause}")
    return AclCommandError(str(exc), lines)


async def describe_acls(conn: AdminConnection, pattern: Pattern | None
                        ) -> list[tuple[Pattern, Entry]]:
    version = conn.version(DESCRIBE_ACLS)
    rtype, name, ptype = pattern or (ResourceType.ANY, None, PatternType.ANY)
    response = await conn.roundtrip(
        DESCRIBE_ACLS, version, resource_type_filter=int(rtype), resource_name_filter=name,
        pattern_type_filter=int(ptype), principal_filter=None, host_filter=None,
        operation=int(AclOperation.ANY), permission_type=int(AclPermissionType.ANY))
    if int(response.error_code):
        raise error_for(int(response.error_code), response.error_message)
    return [((ResourceType(int(r.resource_type)), str(r.resource_name),
              PatternType(int(r.pattern_type))),
             (str(a.principal), str(a.host), AclOperation(int(a.operation)),
              AclPermissionType(int(a.permission_type))))
            for r in response.resources for a in r.acls]


async def create_acls(conn: AdminConnection, pattern: Pattern, entries: Sequence[Entry]) -> None:
    version = conn.version(CREATE_ACLS)
    mod = _module(CREATE_ACLS, version)
    rtype, name, ptype = pattern
    response = await conn.roundtrip(CREATE_ACLS, version, creations=tuple(
        mod.AclCreation(resource_type=int(rtype), resource_name=name,
                        resource_pattern_type=int(ptype), principal=principal, host=host,
                        operation=int(op), permission_type=int(perm))
        for principal, host, op, perm in entries))
    for result in response.results:
        if int(result.error_code):
            raise error_for(int(result.error_code), result.error_message)


async def delete_acls(conn: AdminConnection, pattern: Pattern, entries: Sequence[Entry | None]
                      ) -> None:
    """One DeleteAcls filter per entry (None: any entry of the pattern)."""
    version = conn.version(DELETE_ACLS)
    mod = _module(DELETE_ACLS, version)
    rtype, name, ptype = pattern
    filters = []
    for entry in entries:
        principal, host, op, perm = entry or (None, None, AclOperation.ANY,
                                              AclPermissionType.ANY)
        filters.append(mod.DeleteAclsFilter(
            resource_type_filter=int(rtype), resource_name_filter=name,
            pattern_type_filter=int(ptype), principal_filter=principal, host_filter=host,
            operation=int(op), permission_type=int(perm)))
    response = await conn.roundtrip(DELETE_ACLS, version, filters=tuple(filters))
    for result in response.filter_results:
        if int(result.error_code):
            raise error_for(int(result.error_code), result.error_message)
        for matching in result.matching_acls:
            if int(matching.error_code):
                raise error_for(int(matching.error_code), matching.error_message)


def format_resource_acls(grouped: dict[Pattern, list[Entry]]) -> str:
    """``AclCommand.printResourceAcls``."""
    return "".join(f"Current ACLs for resource `{pattern_str(p)}`:\n"
                   + "\n".join(f"\t{entry_str(e)}" for e in entries) + "\n\n"
                   for p, entries in grouped.items())


def format_adding(pattern: Pattern, entries: Sequence[Entry]) -> str:
    return (f"Adding ACLs for resource `{pattern_str(pattern)}`: \n "
            + "\n".join(f"\t{entry_str(e)}" for e in entries) + "\n\n")


def _group(found: Sequence[tuple[Pattern, Entry]]) -> dict[Pattern, list[Entry]]:
    grouped: dict[Pattern, list[Entry]] = {}
    for pattern, entry in found:
        entries = grouped.setdefault(pattern, [])
        if entry not in entries:
            entries.append(entry)
    return grouped


def _confirm(args: argparse.Namespace, message: str) -> bool:
    if args.force:
        return True
    print(message, flush=True)
    return sys.stdin.readline().strip().lower() == "y"


def _acls_add(args: argparse.Namespace) -> Callable[[AdminConnection], Awaitable[str]]:
    kind = parse_pattern_type(args.resource_pattern_type)
    if kind not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise UsageError(f"A '--resource-pattern-type' value of '{kind.name}' is not valid "
                         "when adding acls.")
    entries = acl_entries(args)
    filters = resource_filters(args, required=True)
    _validate_operations(filters, entries)
    if not entries:
        raise UsageError("You must specify one of: --allow-principal, --deny-principal when "
                         "trying to add ACLs.")

    async def work(conn: AdminConnection) -> str:
        for pattern in filters:
            print(format_adding(pattern, entries), end="", flush=True)
            await create_acls(conn, pattern, entries)
        return ""

    return work


def _acls_remove(args: argparse.Namespace) -> Callable[[AdminConnection], Awaitable[str]]:
    entries = acl_entries(args)
    filters = resource_filters(args, required=True)
    _validate_operations(filters, entries)

    async def work(conn: AdminConnection) -> str:
        for pattern in filters:
            if not entries:
                question = ("Are you sure you want to delete all ACLs for resource filter "
                            f"`{pattern_str(pattern)}`? (y/n)")
            else:
                question = ("Are you sure you want to remove ACLs: \n "
                            + "\n".join(f"\t{entry_str(e)}" for e in entries)
                            + f"\n from resource filter `{pattern_str(pattern)}`? (y/n)")
            if _confirm(args, question):
                await delete_acls(conn, pattern, list(entries) or [None])
        return ""

    return work


def _acls_list(args: argparse.Namespace) -> Callable[[AdminConnection], Awaitable[str]]:
    filters = resource_filters(args, required=False)
    principals = _unique([_principal(p) for p in args.principal or ()])

    async def work(conn: AdminConnection) -> str:
        found: list[tuple[Pattern, Entry]] = []
        asked: list[Pattern | None] = [*filters] or [None]  # None: every ACL
        for pattern in asked:
            found += await describe_acls(conn, pattern)
        grouped = _group(found)
        if not principals:
            return format_resource_acls(grouped)
        out = ""
        for principal in principals:
            out += f"ACLs for principal `{principal}`\n"
            out += format_resource_acls({p: kept for p, entries in grouped.items()
                                         if (kept := [e for e in entries
                                                      if e[0] == principal])})
        return out

    return work


def cmd_acls(args: argparse.Namespace) -> int:
    try:
        action = check_acl_args(args)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        make = {"add": _acls_add, "remove": _acls_remove, "list": _acls_list}[action]
        work = make(args)
        try:
            call = {"add": "createAcls", "remove": "deleteAcls", "list": "describeAcls"}[action]
            out = _run(lambda: _connected(args, call, work))
        except KafkaError as exc:
            raise _acl_failure(exc) from None
    except (UsageError, CommandConfigError) as exc:
        print(exc, file=sys.stderr)
        return 1
    except AclCommandError as exc:  # AclCommand.main prints these to stdout
        print(f"Error while executing ACL command: {exc}")
        for line in exc.lines:
            print(line)
        return 1
    print(out, end="")
    return 0


# ================================================================== argparse
class _EntityName(argparse.Action):
    """``--entity-name NAME`` and ``--entity-default`` in the order given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        names = list(getattr(namespace, "entity_names", None) or [])
        names.append("" if option_string == "--entity-default" else str(values))
        namespace.entity_names = names


def connection_options(p: argparse.ArgumentParser) -> None:
    """``--bootstrap-server`` and ``--command-config``."""
    p.add_argument("--bootstrap-server", dest="bootstrap_server", metavar="HOST:PORT",
                   help="the proxy or a Kafka broker: host1:port1,host2:port2,...")
    p.add_argument("--command-config", dest="command_config", metavar="FILE",
                   help="Kafka client properties: security.protocol, sasl.mechanism, "
                   "sasl.jaas.config (PlainLoginModule or ScramLoginModule) or sasl.username "
                   "and sasl.password, ssl.truststore.location (PEM or PKCS12) or "
                   "ssl.ca.location, ssl.endpoint.identification.algorithm")


def _entity_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--entity-type", dest="entity_types", action="append", metavar="TYPE",
                   help="users, clients or ips (users and clients together: the clients of "
                   "a user)")
    p.add_argument("--entity-name", dest="entity_names", action=_EntityName, metavar="NAME",
                   help="user principal, client-id or ip, one per --entity-type in order")
    p.add_argument("--entity-default", dest="entity_names", action=_EntityName, nargs=0,
                   help="the default entity of the --entity-type in that place")


def register_quota_commands(qsub: Any) -> None:
    """``quotas describe`` and ``quotas alter`` under the ``quotas`` command."""
    p = qsub.add_parser(
        "describe", help="client quotas as kafka-configs.sh --describe prints them",
        description="Describe client quotas (DescribeClientQuotas) through the proxy or a "
        "Kafka broker, as kafka-configs.sh --describe --entity-type users|clients|ips does.")
    connection_options(p)
    _entity_options(p)
    p.set_defaults(func=cmd_quotas_describe)
    p = qsub.add_parser(
        "alter", help="alter client quotas as kafka-configs.sh --alter",
        description="Alter client quotas (AlterClientQuotas) through the proxy or a Kafka "
        "broker, as kafka-configs.sh --alter --entity-type ... --add-config k=v,... does.")
    connection_options(p)
    _entity_options(p)
    p.add_argument("--add-config", dest="add_config", metavar="K=V,...",
                   help="quotas to set: producer_byte_rate, consumer_byte_rate, "
                   "request_percentage, controller_mutation_rate (ips: "
                   "connection_creation_rate)")
    p.add_argument("--delete-config", dest="delete_config", action="append", metavar="K,...",
                   help="quotas to remove")
    p.set_defaults(func=cmd_quotas_alter)


def register_acls_command(sub: Any) -> None:
    """``acls --list|--add|--remove`` (``kafka-acls.sh``)."""
    p = sub.add_parser(
        "acls", help="list, add and remove ACLs as kafka-acls.sh",
        description="List, add and remove ACLs (DescribeAcls, CreateAcls, DeleteAcls) through "
        "the proxy or a Kafka broker, with kafka-acls.sh's options and output.")
    connection_options(p)
    p.add_argument("--list", action="store_true", help="list ACLs (of the given resources)")
    p.add_argument("--add", action="store_true", help="add ACLs")
    p.add_argument("--remove", action="store_true", help="remove ACLs")
    p.add_argument("--topic", action="append", help="a topic ('*': every topic)")
    p.add_argument("--group", action="append", help="a consumer group ('*': every group)")
    p.add_argument("--transactional-id", dest="transactional_id", action="append",
                   help="a transactional id ('*': every one)")
    p.add_argument("--cluster", action="store_true", help="the cluster resource")
    p.add_argument("--resource-pattern-type", dest="resource_pattern_type", default="literal",
                   metavar="literal|prefixed|match|any",
                   help="literal or prefixed to add; match or any too to list and remove "
                   "(default literal)")
    p.add_argument("--operation", action="append",
                   help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                   "DescribeConfigs, AlterConfigs, IdempotentWrite, All (default All)")
    p.add_argument("--allow-principal", dest="allow_principal", action="append",
                   metavar="TYPE:NAME", help="User:alice (User:'*': every user)")
    p.add_argument("--deny-principal", dest="deny_principal", action="append",
                   metavar="TYPE:NAME")
    p.add_argument("--allow-host", dest="allow_host", action="append",
                   help="host of --allow-principal (default *)")
    p.add_argument("--deny-host", dest="deny_host", action="append",
                   help="host of --deny-principal (default *)")
    p.add_argument("--principal", action="append", metavar="TYPE:NAME",
                   help="--list: only the ACLs of this principal")
    p.add_argument("--force", action="store_true", help="--remove without asking")
    p.set_defaults(func=cmd_acls)
