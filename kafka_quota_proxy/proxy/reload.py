"""Reloading the config file while serving (SIGHUP, or the file polled for changes): its
quotas apply to the live budgets, each feature takes what it applies live (``reload``), and
other sections are reported as needing a restart."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, Protocol

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import load_config
from kafka_quota_proxy.config.schema import ProxyConfig
from kafka_quota_proxy.proxy.feature import Feature
from kafka_quota_proxy.proxy.features.connection_rates import listeners_without_rates
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.proxy.metrics import ProxyStats

log = get_logger("kafka_quota_proxy.server")


class Reloaded(Protocol):
    """What a reload changes of the proxy."""

    config: ProxyConfig
    stats: ProxyStats
    features: list[Feature]

    def reconfigure(self) -> None:
        """The quotas in force changed: every feature takes them."""

    def as_run(self, config: ProxyConfig) -> ProxyConfig:
        """A config read from the file, as this process runs it (a worker's metrics on a
        port of its own): what a reload compares with the config in force."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class ConfigReload:
    def __init__(self, proxy: Reloaded, path: str | None) -> None:
        self.proxy = proxy
        self.path = path
        self._lock = asyncio.Lock()
        self.restart_needed: list[str] = []  # the sections the last reload could not apply

    def reload(self) -> None:
        """SIGHUP: reload in the background (see ``reload_config``)."""
        self.proxy.spawn(self.reload_config())

    async def reload_config(self) -> bool:
        """Re-read the config file; apply its quotas to live budgets. The file is read and
        parsed off the event loop, within the loader's bounds (size, nesting, aliases), so a
        broken or hostile file costs clients nothing. Whatever goes wrong changes nothing, and
        is logged and counted as a failed reload. Other sections need a restart to take
        effect. Reloads run one at a time."""
        if self.path is None:
            return False
        stats = self.proxy.stats
        async with self._lock:
            try:
                new = await asyncio.to_thread(load_config, self.path)
                self.apply(new)
            except ConfigError as exc:
                stats.reloads["failure"] += 1
                log.error("config_reload_failed", file=self.path, errors=exc.errors)
                return False
            except Exception as exc:  # any failure is a failed reload
                stats.reloads["failure"] += 1
                log.error("config_reload_failed", file=self.path,
                          errors=[f"{type(exc).__name__}: {exc}"[:500]])
                return False
        return True

    def apply(self, new: ProxyConfig) -> None:
        proxy = self.proxy
        old = proxy.config
        new = proxy.as_run(new)
        live = ["quotas"]
        if (new.acls is None) == (old.acls is None):  # bindings reload; on/off: a restart
            live.append("acls")
        ignored = [name for name in ProxyConfig.model_fields
                   if name not in live and getattr(new, name) != getattr(old, name)]
        if "listeners" in ignored and (listeners_without_rates(new.listeners)
                                       == listeners_without_rates(old.listeners)):
            ignored.remove("listeners")  # only max_connection_creation_rate: applied live
        for feature in proxy.features:
            feature.reload(new)
        proxy.config = old.model_copy(update={name: getattr(new, name) for name in live})
        if new.quotas.without_shadow() != old.quotas.without_shadow():
            proxy.reconfigure()  # (the shadow alone: its feature took it, in ``reload``)
        proxy.stats.reloads["success"] += 1
        self.restart_needed = ignored
        log.info("config_reloaded", file=self.path, quota_entities=len(new.quotas.entities),
                 **({"restart_needed_for": ignored} if ignored else {}))

    async def watch(self) -> None:
        """Reload when the config file changes (polled every ``quotas.watch_seconds``, as the
        last reload left it; SIGHUP also reloads)."""
        path = self.path
        assert path is not None

        def signature() -> tuple[int, int] | None:
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_mtime_ns, st.st_size

        seen = signature()
        while True:
            await asyncio.sleep(self.proxy.config.quotas.watch_seconds or 2.0)
            current = signature()
            if current is not None and current != seen:
                seen = current
                await self.reload_config()  # never raises: every failure is counted
