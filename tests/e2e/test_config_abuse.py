"""Broken and hostile config files during traffic: every failed reload is logged and counted,
the file watcher keeps running (later valid edits apply without SIGHUP), and a hostile file
(an alias bomb, deep nesting) is refused off the event loop at no visible cost to clients."""

from __future__ import annotations

import signal
import threading
import time

import psutil
import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import KafkaWire, ProxyProcess, wait_for
from testkit.hostile import alias_bomb

pytestmark = pytest.mark.e2e

QUOTAS = """quotas:
  watch_seconds: 0.2
  entities:
    - {client-id: "abused", producer_byte_rate: 100000}
"""


def _reloads(proxy: ProxyProcess, result: str) -> float:
    return proxy.metrics().get(f'kafka_proxy_config_reloads_total{{result="{result}"}}', 0)


def test_watcher_survives_any_bad_file_and_applies_later_edits(tansu: TansuBroker) -> None:
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=QUOTAS).start()
    try:
        proxy.wait_broker_listener(111)
        good = proxy.config_path.read_text()
        bad = [good + "extra: " + "[" * 5000 + "]" * 5000 + "\n",  # RecursionError before
               good + "  bogus: [\n",  # invalid YAML
               good.replace("100000", "-5"),  # negative rate
               good.replace("100000", "fast"),  # wrong type
               good[: good.index("producer_byte_rate") + 5],  # half-written
               ""]  # empty
        for n, text in enumerate(bad, 1):
            proxy.config_path.write_text(text)
            wait_for(lambda n=n: _reloads(proxy, "failure") >= n, 20,
                     what=f"failed reload {n} counted")
        failed = [e for e in proxy.events() if e.get("event") == "config_reload_failed"]
        assert "nested deeper than 64 levels" in failed[0]["errors"][0]
        # The watcher still runs: a valid edit applies without SIGHUP.
        proxy.config_path.write_text(good.replace("100000", "50000"))
        wait_for(lambda: _reloads(proxy, "success") >= 1, 20, what="the valid edit applied")
        assert _reloads(proxy, "failure") == len(bad)
        assert proxy.alive
        assert not [e for e in proxy.events() if "Traceback" in str(e)
                    or "exception was never retrieved" in str(e)]
    finally:
        proxy.stop()
    assert "never retrieved" not in proxy.log_path.read_text()


def test_alias_bomb_on_sighup_costs_clients_nothing(tansu: TansuBroker) -> None:
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=QUOTAS.replace("0.2", "0")).start()
    try:
        port = proxy.wait_broker_listener(111)
        assert proxy.process is not None
        process = psutil.Process(proxy.process.pid)
        rss_before = process.memory_info().rss
        proxy.config_path.write_text(proxy.config_path.read_text() + alias_bomb())
        peak = rss_before
        round_trips: list[float] = []
        done = threading.Event()

        def probe() -> None:  # a client's round trips while the file is refused
            with KafkaWire("127.0.0.1", port) as wire:
                while not done.is_set():
                    start = time.monotonic()
                    wire.request(18, 3, client_software_name="probe",
                                 client_software_version="1")
                    round_trips.append(time.monotonic() - start)

        thread = threading.Thread(target=probe)
        thread.start()
        try:
            wait_for(lambda: len(round_trips) >= 10, 20, what="the probe running")
            proxy.process.send_signal(signal.SIGHUP)

            def refused() -> bool:
                nonlocal peak
                peak = max(peak, process.memory_info().rss)
                return _reloads(proxy, "failure") >= 1

            wait_for(refused, 10, interval=0.02, what="the alias bomb refused")
            count = len(round_trips)
            wait_for(lambda: len(round_trips) >= count + 10, 20, what="more round trips")
        finally:
            done.set()
            thread.join(30)
        failed = [e for e in proxy.events() if e.get("event") == "config_reload_failed"]
        assert "once its aliases are expanded" in failed[-1]["errors"][0]
        assert peak - rss_before < 50 << 20, (rss_before, peak)
        print(f"\nalias bomb: RSS {rss_before >> 20} -> peak {peak >> 20} MB; slowest round "
              f"trip {max(round_trips[1:]) * 1000:.1f} ms of {len(round_trips)} (first "
              f"{round_trips[0] * 1000:.1f} ms, connecting upstream)")
        assert proxy.alive
    finally:
        proxy.stop()
