"""Structured logging (structlog): JSON lines by default, human-readable console optionally."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(fmt: str = "json", level: str = "info", stream: Any = None,
              worker: int | None = None) -> None:
    """``worker``: every line says which worker process wrote it (``proxy.workers``)."""
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *([_worker_field(worker)] if worker is not None else []),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def _worker_field(worker: int) -> Any:
    def add(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        event.setdefault("worker", worker)
        return event

    return add


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


class _ClientLogs(logging.Handler):
    """The Kafka client's own log records, as structured debug events."""

    def emit(self, record: logging.LogRecord) -> None:
        get_logger("kafka_quota_proxy.kafka_client").debug(
            "kafka_client_log", logger=record.name, level_name=record.levelname.lower(),
            message=record.getMessage())


def route_client_logs() -> None:
    """Send the Kafka client's (aiokafka) warnings and errors, plain text on stderr through
    stdlib logging, to the structured log at debug: its users report failures themselves."""
    client = logging.getLogger("aiokafka")
    client.handlers[:] = [_ClientLogs()]
    client.setLevel(logging.WARNING)
    client.propagate = False


class RateLimitedLog:
    """One line every ``every_s`` seconds at most, of ``event`` at ``level`` on ``logger``;
    the lines left out are counted in the next (``more_since_last_logged``)."""

    def __init__(self, logger: Any, event: str, level: str = "warning",
                 every_s: float = 1.0) -> None:
        self._write = getattr(logger, level)
        self.event = event
        self.every_s = every_s
        self.logged_at = float("-inf")
        self.left_out = 0

    def __call__(self, **fields: Any) -> None:
        now = time.monotonic()
        if now - self.logged_at < self.every_s:
            self.left_out += 1
            return
        self._write(self.event, **fields,
                    **({"more_since_last_logged": self.left_out} if self.left_out else {}))
        self.logged_at = now
        self.left_out = 0
