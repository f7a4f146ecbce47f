"""The traffic capture: one row of metadata per request (``CaptureFilter``), written to
Parquet off the event loop (``Capture``), with the quota config of each generation next to
it, so that a replay uses the configuration that was live when each request was recorded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from kafka_quota_proxy.proxy.feature import Feature, Runtime
from kafka_quota_proxy.proxy.features.capture.filter import CaptureFilter
from kafka_quota_proxy.proxy.features.capture.writer import Capture
from kafka_quota_proxy.proxy.logs import get_logger

if TYPE_CHECKING:
    from kafka_quota_proxy.config.schema import CaptureConfig, QuotasConfig
    from kafka_quota_proxy.proxy.filters.base import Filter, FilterFactory

__all__ = ["Capture", "CaptureFeature", "CaptureFilter"]

log = get_logger("kafka_quota_proxy.capture")


class CaptureError(Exception):
    """The capture directory cannot be written (the proxy does not start)."""


class CaptureFeature(Feature):
    name = "capture"

    @classmethod
    def make(cls, runtime: Runtime) -> CaptureFeature | None:
        if runtime.config.capture is None:
            return None
        return cls(runtime, runtime.config.capture)

    def __init__(self, runtime: Runtime, config: CaptureConfig) -> None:
        self.runtime = runtime
        self.config = config
        self.capture: Capture | None = None  # opened at start
        self._written: int | None = None  # the quota generation last written

    def start(self, runtime: Runtime) -> None:
        c = self.config
        try:
            self.capture = Capture(c.dir, c.rotate_mb, c.rotate_seconds,
                                   queue_batches=c.queue_batches, batch=c.batch_records,
                                   instance=runtime.process.split("/", 1)[0],
                                   process=runtime.process)
        except OSError as exc:
            raise CaptureError(f"cannot write capture.dir {c.dir}: {exc}") from None
        self._write_quota_config(runtime.effective_quotas())
        runtime.spawn(self._flush())

    def filters(self, scope: int) -> list[tuple[type[Filter], FilterFactory]]:
        if self.capture is None:
            return []
        return [(CaptureFilter,
                 partial(CaptureFilter, capture=self.capture, quotas=self.runtime.quotas))]

    def reconfigure(self, quotas: QuotasConfig, now_ms: int) -> None:
        self._write_quota_config(quotas)

    def _write_quota_config(self, quotas: QuotasConfig) -> None:
        """Next to the capture: the quota config of each generation (the YAML's with the
        altered quotas over it)."""
        capture = self.capture
        generation = self.runtime.quotas.generation
        if capture is None or generation == self._written:
            return
        self._written = generation
        doc = {
            "run": capture.run,
            "quota_generation": generation,
            "since_ms": int(time.time() * 1000),
            # (the live quotas: a shadow is never in force, its changes bump no generation)
            "quotas": quotas.without_shadow().model_dump(mode="json", by_alias=True,
                                                         exclude_none=True),
        }
        storage = self.runtime.config.storage
        if storage is not None:  # what a replay needs besides storage_scale
            doc["storage"] = {"unquoted_producer_byte_rate": storage.unquoted_producer_byte_rate,
                              "exempt_users": storage.exempt_users}
        path = capture.directory / f"quotas-{capture.run}-{generation:05d}.json"
        try:
            path.write_text(json.dumps(doc, indent=1))
        except OSError as exc:
            log.error("capture_config_write_failed", path=str(path), error=str(exc))

    async def _flush(self) -> None:
        while self.capture is not None:
            await asyncio.sleep(1.0)
            self.capture.flush()

    def metric_families(self) -> Iterator[Any]:
        if self.capture is None:
            return iter(())
        return self.capture.metric_families()

    async def stop(self) -> None:
        if self.capture is None:
            return
        capture, self.capture = self.capture, None
        await asyncio.get_running_loop().run_in_executor(None, capture.close)
        log.info("capture_closed", records=capture.records, dropped=capture.dropped,
                 files=capture.writer.files_written)
