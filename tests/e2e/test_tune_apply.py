"""A tuning report's recommendation applied to a running proxy (issue 30, item 4):
``kafka-quota-proxy quotas apply --file REPORT`` (what ``replay --tune --apply`` runs after the
replay) against a proxy in front of tansu, with quotas, quota admin and a capture. The dry run
prints the diff and changes nothing (kafka-python's DescribeClientQuotas sees the same quotas,
no new quota generation is captured); ``--yes`` applies it: DescribeClientQuotas reports the
recommended values, the budget of a live producer takes the new limit, the key the
recommendation leaves out is kept, and the capture's next ``quotas-*.json`` generation holds
the applied quotas."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.demo.embedded_broker import TansuBroker
from kafka_quota_proxy.quota.client_quotas import Entity
from testkit.e2e import ProxyProcess, new_topic, wait_for
from testkit.quota_admin import Admin

pytestmark = pytest.mark.e2e

ALICE: Entity = (("user", "alice"),)
APP: Entity = (("client-id", "app"),)
DEFAULT_USER: Entity = (("user", None),)
DEFAULT_USER_APP: Entity = (("client-id", "app"), ("user", None))
APP_PRODUCE = 'broker="111",client_id="app",quota="produce",user=""'
LIMIT = "kafka_proxy_quota_entity_bytes_per_second_limit"

LIVE_YAML = """  entities:
    - {user: alice, producer_byte_rate: 2000000}
    - {client-id: app, producer_byte_rate: 500000, consumer_byte_rate: 800000,
       controller_mutation_rate: 5}
    - {user: <default>, request_percentage: 50}
"""
RECOMMENDED = """quotas:
  window: {samples: 11, size_seconds: 1}
  entities:
    - {user: alice, producer_byte_rate: 1500000}
    - {client-id: app, producer_byte_rate: 700000, consumer_byte_rate: 800000}
    - {user: <default>, client-id: app, consumer_byte_rate: 300000}
"""
APPLIED = {ALICE: {"producer_byte_rate": 1_500_000.0},
           APP: {"producer_byte_rate": 700_000.0, "consumer_byte_rate": 800_000.0,
                 "controller_mutation_rate": 5.0},
           DEFAULT_USER: {"request_percentage": 50.0},
           DEFAULT_USER_APP: {"consumer_byte_rate": 300_000.0}}


def _described(admin: Admin) -> dict[Entity, dict[str, float]]:
    return {tuple(sorted(e)): v for e, v in admin.quotas().items()}


def _generations(capture: Path) -> dict[int, dict[Entity, dict[str, float]]]:
    """The quota config of each generation the capture holds, as client quota entities."""
    out = {}
    for path in capture.glob("quotas-*.json"):
        doc = json.loads(path.read_text())
        quotas = QuotasConfig.model_validate(doc["quotas"]).static_quotas()
        out[int(doc["quota_generation"])] = {tuple(sorted(e)): v for e, v in quotas.items()}
    return out


def test_a_recommendation_dry_run_then_applied(tansu: TansuBroker, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    began = time.monotonic()
    capture = tmp_path / "capture"
    report = tmp_path / "report"
    report.mkdir()
    (report / "recommended-quotas.yaml").write_text(RECOMMENDED)
    proxy = ProxyProcess(tansu.bootstrap, extra_yaml=f"""quotas:
  admin_principals: [ANONYMOUS]
{LIVE_YAML}capture:
  dir: "{capture}"
""").start()
    admin = None
    producer: Producer | None = None
    try:
        proxy.wait_broker_listener(111)
        admin = Admin(proxy.bootstrap)
        # a producer of client-id app: its budget, under the live quota
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "app",
                             "linger.ms": 0})
        topic = new_topic(proxy.bootstrap, "apply")

        def produce() -> None:
            assert producer is not None
            for _ in range(3):
                producer.produce(topic, value=b"x" * 100)
            assert producer.flush(20) == 0

        produce()
        assert proxy.metrics()[f"{LIMIT}{{{APP_PRODUCE}}}"] == 500_000
        live = _described(admin)
        assert live == {ALICE: {"producer_byte_rate": 2_000_000.0},
                        APP: {"producer_byte_rate": 500_000.0, "consumer_byte_rate": 800_000.0,
                              "controller_mutation_rate": 5.0},
                        DEFAULT_USER: {"request_percentage": 50.0}}
        before = _generations(capture)
        assert list(before.values()) == [live]  # the generation the proxy started with

        apply = ["quotas", "apply", "--file", str(report), "--bootstrap-server",
                 proxy.bootstrap]
        # the dry run: a diff, validate_only, nothing altered
        assert main(apply) == 0
        out = capsys.readouterr().out
        print(out)
        for line in ("  producer_byte_rate        2000000 -> 1500000  change",
                     "  consumer_byte_rate        (unset) -> 300000  add",
                     "  consumer_byte_rate        800000  unchanged",
                     "  controller_mutation_rate  5  kept (not in the recommendation)",
                     "  request_percentage        50  kept (not in the recommendation)",
                     "dry run: validate_only accepted the changes to 3 entities; nothing "
                     "altered (--yes applies them)"):
            assert line in out.splitlines()
        assert _described(admin) == live
        assert _generations(capture) == before

        # --yes: applied, described, enforced, captured as a new generation
        assert main([*apply, "--yes"]) == 0
        out = capsys.readouterr().out
        print(out)
        assert out.endswith("applied: 3 entities altered\n")
        assert _described(admin) == APPLIED
        produce()
        wait_for(lambda: proxy.metrics().get(f"{LIMIT}{{{APP_PRODUCE}}}") == 700_000, 10,
                 interval=0.2, what="app's budget under the applied quota")
        wait_for(lambda: len(_generations(capture)) > len(before), 10, interval=0.2,
                 what="a new quota generation in the capture")
        after = _generations(capture)
        assert min(after) == min(before)
        assert after[max(after)] == APPLIED
        assert max(after) > max(before)

        # applied again: nothing left to change
        assert main([*apply, "--yes"]) == 0
        assert capsys.readouterr().out.endswith(
            "nothing to apply: every recommended quota is already in force\n")
    finally:
        producer = None  # (destroyed before the proxy goes)
        gc.collect()
        if admin is not None:
            admin.close()
        proxy.stop()
    print(f"test took {time.monotonic() - began:.1f} s")
    assert proxy.events()[-1]["event"] == "proxy_stopped"
