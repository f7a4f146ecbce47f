"""Command line: ``kafka-quota-proxy run|check-config|volume-agent|demo|quotas|acls|...``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kafka_quota_proxy import __version__
from kafka_quota_proxy.cli import admin_tools, apply_quotas
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import load_agent_config, load_config, load_quotas_config
from kafka_quota_proxy.config.schema import ProxyConfig, QuotasConfig
from kafka_quota_proxy.config.summary import summarize

T = TypeVar("T")


def _event_loop_runner(coro: Any) -> int:
    import uvloop

    result: int = uvloop.run(coro)
    return result


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve(config_path: str) -> int:
    from kafka_quota_proxy.proxy import logs
    from kafka_quota_proxy.proxy.server import StartupError, run_proxy
    from kafka_quota_proxy.proxy.workers import Supervisor, worker_count, worker_identity

    config = load_config(config_path)
    identity = worker_identity()
    logs.configure(config.logging.format, config.logging.level,
                   worker=identity[0] if identity else None)
    stop = _stop_on_signals()
    try:
        if identity is not None:  # one of a supervisor's workers
            await run_proxy(config, stop, config_path, worker=identity)
        elif (count := worker_count(config)) > 1:
            await Supervisor(config, config_path, count).run(stop)
        else:
            await run_proxy(config, stop, config_path)
    except StartupError as exc:
        print(f"kafka-quota-proxy: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from kafka_quota_proxy.proxy.files import file_checks

    try:  # the files it names too, as check-config checks them, before anything starts
        load_config(args.config, checks=file_checks)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    return _event_loop_runner(_serve(args.config))


def _cmd_check_config(args: argparse.Namespace) -> int:
    from kafka_quota_proxy.proxy.files import file_checks

    try:  # the files it names too (certificates, keys, credentials...), as run reads them
        config = load_config(args.file, checks=file_checks)
    except ConfigError as exc:
        print(f"{args.file}: invalid configuration ({len(exc.errors)} error(s)):", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{args.file}: configuration is valid")
    print(summarize(config))
    return 0


async def _run_volume_agent(config_path: str) -> int:
    from kafka_quota_proxy.proxy import logs
    from kafka_quota_proxy.volume_agent.agent import AgentError, run_agent

    file = load_agent_config(config_path)
    logs.configure(file.logging.format, file.logging.level)
    logs.route_client_logs()
    stop = _stop_on_signals()
    try:
        await run_agent(file, stop)
    except AgentError as exc:
        print(f"kafka-quota-proxy volume-agent: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_volume_agent(args: argparse.Namespace) -> int:
    try:
        load_agent_config(args.config)
    except ConfigError as exc:
        print(f"{args.config}: invalid configuration ({len(exc.errors)} error(s)):",
              file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 2
    return _event_loop_runner(_run_volume_agent(args.config))


def _load_quotas(path: str, *, quota_only: bool = False) -> QuotasConfig | None:
    """The ``quotas`` section of ``path``, or None after printing its errors. ``quota_only``:
    a file with nothing but ``quotas:`` is accepted too (the what-if tools)."""
    if quota_only:
        return _loaded(path, load_quotas_config)
    config = _loaded(path, load_config)
    return None if config is None else config.quotas


def _loaded(path: str, load: Callable[[str], T]) -> T | None:
    """``load(path)``, or None after printing its errors."""
    try:
        return load(path)
    except ConfigError as exc:
        print(f"{path}: invalid configuration:", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return None


def _cmd_quotas_resolve(args: argparse.Namespace) -> int:
    import json

    from kafka_quota_proxy.cli.whatif import resolve_json

    if args.cluster:  # the quotas altered with AlterClientQuotas over the file's
        config = _loaded(args.config, load_config)
        if config is None:
            return 1
        overrides = _read_overrides(config)
        if overrides is None:
            return 1
        quotas: QuotasConfig | None = config.quotas.with_overrides(overrides)
    else:
        quotas = _load_quotas(args.config, quota_only=True)
    if quotas is None:
        return 1
    print(json.dumps(resolve_json(quotas, args.user, args.client_id), indent=2))
    return 0


def _read_overrides(config: ProxyConfig) -> dict[Any, dict[str, float]] | None:
    """The overrides topic of ``config``'s cluster, or None after printing why not."""
    from kafka_quota_proxy.proxy.features.quota_admin.admin import read_overrides
    from kafka_quota_proxy.proxy.tls import TlsFileError, kafka_client_options

    try:
        options = kafka_client_options(config.upstream)
        return asyncio.run(read_overrides(
            [str(b) for b in config.upstream.bootstrap_servers], config.quotas.overrides.topic,
            options))
    except (TlsFileError, OSError, TimeoutError) as exc:
        print(f"cannot read the quota overrides from the cluster: {exc}", file=sys.stderr)
        return None
    except Exception as exc:  # aiokafka's errors
        print(f"cannot read the quota overrides from the cluster: {exc!r}", file=sys.stderr)
        return None


def _add_pacing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pacing", choices=("kafka", "strict"), default=None,
                   help="the quotas paced this way instead of as --config says (quotas."
                   "pacing): the same traffic under both, to compare")


def _with_pacing(quotas: QuotasConfig, pacing: str | None) -> QuotasConfig | None:
    """``quotas`` with ``--pacing`` in place of its own (None after printing why not)."""
    if pacing is None:
        return quotas
    if pacing == "strict" and quotas.cap_byte_rate_throttle:
        print("--pacing strict: the config bounds byte-rate throttles at one window "
              "(cap_byte_rate_throttle: true), which strict pacing cannot hold",
              file=sys.stderr)
        return None
    return quotas.model_copy(update={"pacing": pacing})


def _cmd_quotas_simulate(args: argparse.Namespace) -> int:
    from kafka_quota_proxy.cli.whatif import run_simulate

    quotas = _load_quotas(args.config, quota_only=True)
    if quotas is not None:
        quotas = _with_pacing(quotas, args.pacing)
    if quotas is None:
        return 1
    if args.events == "-":
        return run_simulate(quotas, sys.stdin, sys.stdout)
    try:
        with open(args.events, encoding="utf-8") as events:
            return run_simulate(quotas, events, sys.stdout)
    except OSError as exc:
        print(f"{args.events}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _cmd_replay(args: argparse.Namespace) -> int:
    """Spark jobs over a capture (``spark_jobs``, imported only here: the proxy itself never
    needs Spark)."""
    usage = _apply_usage(args)
    if usage:
        print(f"kafka-quota-proxy replay: error: {usage}", file=sys.stderr)
        return 2
    quotas = _load_quotas(args.config)
    if quotas is not None:
        quotas = _with_pacing(quotas, args.pacing)
    if quotas is None:
        return 1
    try:
        from kafka_quota_proxy.spark_jobs.main import run
        from kafka_quota_proxy.spark_jobs.tune import TuneOptions
    except ImportError as exc:
        print(f"replay needs the spark extra (pip install 'kafka-quota-proxy[spark]'): {exc}",
              file=sys.stderr)
        return 1
    try:
        options = TuneOptions(percentile=args.percentile / 100.0,
                              min_minutes=args.min_minutes, broker_threads=args.broker_threads,
                              total_budget=args.total_budget, headroom=args.headroom,
                              span_seconds=args.span_seconds)
        facts = run(args.capture, args.out, quotas.model_dump(exclude_none=True),
                    master=args.master, tune=args.tune, options=options)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"kafka-quota-proxy replay: {exc}", file=sys.stderr)
        return 1
    if args.tune:
        _write_recommended_config(args.config, Path(args.out))
    for key, value in facts.items():
        if isinstance(value, list):
            print(f"{key}:" + "".join(f"\n  {line}" for line in value))
        elif key != "match_rate":
            print(f"{key}: {value}")
    print(f"report: {Path(args.out) / 'report.md'}")
    if args.apply:  # the recommendation through AlterClientQuotas (a dry run unless --yes)
        return apply_quotas.run_apply(Path(args.out) / apply_quotas.REPORT_FILE,
                                      args.bootstrap_server, args.command_config, args.yes)
    return 0


def _apply_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with replay's --apply options, if anything."""
    if args.apply and not args.tune:
        return "--apply needs --tune (it applies the recommendation)"
    if args.apply and not args.bootstrap_server:
        return "--apply needs --bootstrap HOST:PORT"
    if not args.apply:
        given = [flag for flag, value in (("--bootstrap", args.bootstrap_server),
                                          ("--command-config", args.command_config),
                                          ("--yes", args.yes)) if value]
        if given:
            return f"{', '.join(given)} only go with --apply"
    return None


def _write_recommended_config(config_path: str, out: Path) -> None:
    """``out/recommended.yaml``: the given config with the recommended quotas (so that
    ``check-config`` validates it whole)."""
    import yaml

    base = yaml.safe_load(Path(config_path).read_text()) or {}
    recommended = yaml.safe_load((out / "recommended-quotas.yaml").read_text())["quotas"]
    kept = {k: v for k, v in (base.get("quotas") or {}).items() if k not in ("entities",
                                                                            "window")}
    base["quotas"] = {**kept, **recommended}
    (out / "recommended.yaml").write_text(yaml.safe_dump(base, sort_keys=False))


def _cmd_demo(args: argparse.Namespace) -> int:
    from kafka_quota_proxy.demo.run import run_demo

    return run_demo(seconds=args.seconds, out_dir=args.out, replay=args.replay)


def _cmd_credentials_add(args: argparse.Namespace) -> int:
    """Add or replace a user in a credentials file (salted SCRAM credentials only): the
    password is read from standard input (its first line), never from the command line."""
    import getpass

    from kafka_quota_proxy.security.credentials import add_user

    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.user}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("no password given", file=sys.stderr)
        return 2
    path = Path(args.file)
    try:
        text = path.read_text() if path.exists() else ""
        new = add_user(text, args.user, password, args.iterations)
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    _write_credentials(path, new)
    print(f"{path}: {args.user} set (SCRAM-SHA-256, SCRAM-SHA-512, "
          f"{args.iterations} iterations)")
    return 0


def _write_credentials(path: Path, text: str) -> None:
    """Replace the file at once (the proxy never reads a half-written file), readable by its
    owner only."""
    import contextlib
    import os

    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # (left by an earlier run: never reused with its permissions)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cmd_credentials_list(args: argparse.Namespace) -> int:
    """The users of a credentials file and their mechanisms (never a salt or a key)."""
    from kafka_quota_proxy.security.credentials import Credentials, listing

    path = Path(args.file)
    try:
        credentials = Credentials.parse(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    users = listing(credentials)
    for user, mechanisms in users:
        print(f"{user}\t" + ", ".join(f"{m} ({n} iterations)" for m, n in mechanisms))
    print(f"{path}: {len(users)} user{'s' if len(users) != 1 else ''}", file=sys.stderr)
    return 0


def _cmd_credentials_remove(args: argparse.Namespace) -> int:
    """Remove a user from a credentials file (the proxy refuses its logins from the next
    reload of the file on)."""
    from kafka_quota_proxy.security.credentials import remove_user

    path = Path(args.file)
    try:
        new = remove_user(path.read_text(), args.user)
    except KeyError:
        print(f"{path}: no user {args.user!r}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    _write_credentials(path, new)
    print(f"{path}: {args.user} removed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafka-quota-proxy",
        description="A Kafka wire-protocol proxy: every broker behind one proxy, "
        "client quotas enforced as a Kafka broker would.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the proxy")
    p.add_argument("--config", required=True, metavar="FILE", help="YAML configuration file")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("check-config", help="validate a configuration file and summarise it")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=_cmd_check_config)

    p = sub.add_parser(
        "volume-agent",
        help="run beside a broker: publish the usage of its log-dir volumes to the storage "
        "topic, at start and every interval",
    )
    p.add_argument("--config", required=True, metavar="FILE",
                   help="YAML configuration file with a storage section and storage.agent")
    p.set_defaults(func=_cmd_volume_agent)

    p = sub.add_parser(
        "demo",
        help="start a local tansu broker and the proxy with quotas, run producers and "
        "consumers as three users through it, show their rates, quotas and throttles live, "
        "reload a quota half-way, then replay the capture and recommend quotas",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=60,
        help="how long the clients run (default 60; 0: until Ctrl-C); the quota reload "
        "happens half-way",
    )
    p.add_argument("--out", metavar="DIR", default="kafka-quota-proxy-demo",
                   help="where the config, capture and report go (default "
                   "./kafka-quota-proxy-demo, replaced on each run)")
    p.add_argument("--no-replay", dest="replay", action="store_false",
                   help="skip the replay and tuning at the end (they need Java 17+)")
    p.set_defaults(func=_cmd_demo)
    q = sub.add_parser("quotas", help="what-if tools over the proxy's quota engine; describe "
                       "and alter client quotas (kafka-configs.sh)")
    qsub = q.add_subparsers(dest="quotas_command", required=True, metavar="COMMAND")
    config_help = ("YAML file with a quotas: section: a file with only quotas: is enough, or "
                   "a full proxy configuration (then validated whole)")
    p = qsub.add_parser(
        "resolve", help="which quota entity and limits apply to a user/client-id",
        description="Print which configured quota entity applies to a user (principal, as the "
        "proxy names it: mTLS subject after the mapping rules, SASL user, or ANONYMOUS) and a "
        "client-id, by Kafka's 8-level precedence, with the limits that apply.")
    p.add_argument("--config", required=True, metavar="FILE", help=config_help)
    p.add_argument("--user", default="ANONYMOUS", help="principal name (default ANONYMOUS)")
    p.add_argument("--client-id", default="", dest="client_id")
    p.add_argument("--cluster", action="store_true",
                   help="also apply the quotas altered with AlterClientQuotas, read from the "
                   "overrides topic of the configured cluster (needs a full proxy "
                   "configuration)")
    p.set_defaults(func=_cmd_quotas_resolve)
    p = qsub.add_parser(
        "simulate", help="run JSON-lines events through the quota engine and print each "
        "record's throttle time",
        description="Record events into the proxy's own quota engine and print, per event, "
        "the throttle it gets, the entity whose budget it went to and that budget's limit (JSON "
        "lines). Each input line is a JSON object in time order: {\"t_ms\": 0, \"user\": "
        "\"alice\", \"client_id\": \"app\", \"quota\": \"produce\"|\"fetch\"|\"request\", "
        "\"value\": bytes, or milliseconds of request time}; user defaults to ANONYMOUS and "
        "client_id to \"\". A line {\"t_ms\": ..., \"alter\": {\"entity\": {...}, \"set\": "
        "{...}, \"remove\": [...]}} changes the quotas from then on.")
    p.add_argument("--config", required=True, metavar="FILE", help=config_help)
    p.add_argument("--events", required=True, metavar="FILE", help="JSON lines, or - for stdin")
    _add_pacing(p)
    p.set_defaults(func=_cmd_quotas_simulate)
    admin_tools.register_quota_commands(qsub)
    apply_quotas.register_apply_command(qsub)
    admin_tools.register_acls_command(sub)

    c = sub.add_parser("credentials", help="the users of a proxy that terminates SASL")
    csub = c.add_subparsers(dest="credentials_command", required=True, metavar="COMMAND")
    p = csub.add_parser("add", help="add or replace a user (password read from stdin)")
    p.add_argument("--file", required=True, metavar="FILE",
                   help="the credentials file (listeners.security.sasl.credentials_file)")
    p.add_argument("--user", required=True)
    p.add_argument("--iterations", type=int, default=8192,
                   help="SCRAM iterations (at least 4096; default 8192)")
    p.set_defaults(func=_cmd_credentials_add)
    p = csub.add_parser("list", help="the users and their SCRAM mechanisms (never a secret)")
    p.add_argument("--file", required=True, metavar="FILE", help="the credentials file")
    p.set_defaults(func=_cmd_credentials_list)
    p = csub.add_parser("remove", help="remove a user")
    p.add_argument("--file", required=True, metavar="FILE", help="the credentials file")
    p.add_argument("--user", required=True)
    p.set_defaults(func=_cmd_credentials_remove)

    p = sub.add_parser("replay", help="Spark jobs over a traffic capture: reproduce the "
                       "recorded throttles, replay under a config, profile, recommend quotas")
    p.add_argument("--capture", required=True, metavar="DIR", help="the capture directory")
    p.add_argument("--config", required=True, metavar="FILE",
                   help="a proxy config whose quotas are replayed (and the base of --tune)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the report goes")
    _add_pacing(p)
    p.add_argument("--master", default=None, metavar="URL",
                   help="Spark master (default: local[*], or what spark-submit sets)")
    p.add_argument("--tune", action="store_true",
                   help="recommend quotas: out/recommended.yaml, replayed in the report (the "
                   "entities of --config kept, values from the load its clients offered)")
    p.add_argument("--percentile", type=float, default=99.0, metavar="P",
                   help="--tune: a budget's demand is this percentile of its per-second "
                   "offered load over the seconds with clients present in the capture's "
                   "whole minutes (default 99)")
    p.add_argument("--min-minutes", type=float, default=5, dest="min_minutes", metavar="N",
                   help="--tune: whole minutes of data needed to set a value; with fewer, the "
                   "live value is kept (default 5)")
    p.add_argument("--span-seconds", type=int, default=60, dest="span_seconds", metavar="N",
                   help="--tune: count whole spans of N seconds (1-60) instead of whole "
                   "minutes, for a short capture: --span-seconds 10 --min-minutes 0.5 tunes "
                   "from three whole 10 s spans, as the demo does (default 60)")
    p.add_argument("--broker-threads", type=int, default=11, dest="broker_threads",
                   metavar="N", help="--tune: request_percentage is at most 100 x N (the "
                   "brokers' num.network.threads + num.io.threads; default 3 + 8 = 11)")
    p.add_argument("--total-budget", choices=("keep", "free"), default="keep",
                   dest="total_budget",
                   help="--tune: keep: the sum of the limits over the budgets seen stays at "
                   "or below that of --config (default); free: no such cap")
    p.add_argument("--headroom", type=float, default=1.5, metavar="X",
                   help="--tune: limits are X times the demand (default 1.5)")
    p.add_argument("--apply", action="store_true",
                   help="--tune: then write the recommendation to the cluster with "
                   "AlterClientQuotas (as quotas apply): a diff per entity and quota key "
                   "against what DescribeClientQuotas reports, sent with validate_only; "
                   "altered only with --yes. Keys set live but not recommended are kept")
    p.add_argument("--bootstrap", "--bootstrap-server", dest="bootstrap_server",
                   metavar="HOST:PORT", help="--apply: the proxy (or a Kafka broker)")
    p.add_argument("--command-config", dest="command_config", metavar="FILE",
                   help="--apply: Kafka client properties for the connection (as "
                   "kafka-configs.sh reads them)")
    p.add_argument("--yes", action="store_true",
                   help="--apply: alter for real after validate_only (default: a dry run)")
    p.set_defaults(func=_cmd_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
