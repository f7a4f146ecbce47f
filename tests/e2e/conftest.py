from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from testkit.e2e import ProxyProcess, wait_for


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    broker = TansuBroker(log_path=str(log)).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def proxy(tansu: TansuBroker) -> Iterator[ProxyProcess]:
    p = ProxyProcess(tansu.bootstrap).start()
    p.wait_broker_listener(111)
    yield p
    p.stop()


@pytest.fixture
def wait() -> object:
    return wait_for


@pytest.fixture(autouse=True)
def _clients_gone() -> Iterator[None]:
    """Clients a test left to the garbage collector (a librdkafka handle in a reference
    cycle) are destroyed within the test, so that nothing they log reaches the terminal
    outside pytest's capture, nor hits a later test's broker."""
    yield
    gc.collect()
