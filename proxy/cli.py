"""Command line: ``kafka-quota-proxy run|check-config|demo``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from proxy import __version__
from proxy.config import ConfigError, load_config, summarize


def _event_loop_runner(coro: Any) -> int:
    import uvloop

    result: int = uvloop.run(coro)
    return result


async def _serve(config_path: str) -> int:
    from proxy import logs
    from proxy.server import StartupError, run_proxy

    config = load_config(config_path)
    logs.configure(config.logging.format, config.logging.level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run_proxy(config, stop)
    except StartupError as exc:
        print(f"kafka-quota-proxy: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        load_config(args.config)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    return _event_loop_runner(_serve(args.config))


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as exc:
        print(f"{args.file}: invalid configuration ({len(exc.errors)} error(s)):", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{args.file}: configuration is valid")
    print(summarize(config))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from proxy.demo import run_demo

    return run_demo(seconds=args.seconds, messages_per_second=args.rate)


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
        "demo",
        help="start a local tansu broker and the proxy, run a producer "
        "and a consumer through it, and show per-client rates",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=0,
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    p.add_argument("--rate", type=int, default=2000, help="messages per second to produce")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
