"""The table of Kafka's authorization checks per API: every API the proxy knows has its entry,
docs/acls.md shows the table as generated, and the entries that matter most say what
Kafka's request handlers do."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_quota_proxy.authorizer.acls import AclOperation, ResourceType
from kafka_quota_proxy.authorizer.api_checks import (
    API_CHECKS,
    AUDIENCES,
    ERROR_NAMES,
    ApiChecks,
    Check,
    render_table,
)
from kafka_quota_proxy.protocol._api_table import API_TABLE

Op, R = AclOperation, ResourceType
DOC = Path(__file__).resolve().parents[3] / "docs" / "acls.md"
BEGIN, END = "<!-- api-checks:begin -->", "<!-- api-checks:end -->"


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def _has(entry: ApiChecks, resource: ResourceType, op: AclOperation, denied: int,
         **fields: object) -> Check:
    for check in entry.checks:
        if (check.resource is resource and check.operation is op and check.denied == denied
                and all(getattr(check, k) == v for k, v in fields.items())):
            return check
    raise AssertionError(f"{entry.name}: no {op.name} on {resource.name} -> {denied}")


def test_every_known_api_has_an_entry_and_no_other() -> None:
    assert set(API_CHECKS) == set(API_TABLE)
    for key, (kio_name, *_) in API_TABLE.items():
        assert _norm(API_CHECKS[key].name) == _norm(kio_name), key
        assert API_CHECKS[key].api_key == key


def test_entries_are_well_formed() -> None:
    for entry in API_CHECKS.values():
        assert entry.audience in AUDIENCES, entry.name
        assert entry.source, entry.name
        assert entry.checks or entry.note, f"{entry.name}: no check must be explained"
        assert not (entry.checks and entry.checks[0].or_else), entry.name
        for check in entry.checks:
            assert check.denied in ERROR_NAMES, entry.name
            assert check.on, entry.name
        # a chain's checks share the error its last one gives
        for before, check in zip(entry.checks, entry.checks[1:], strict=False):
            if check.or_else:
                assert before.denied == check.denied, entry.name


def test_the_doc_shows_the_generated_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    between = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert between.strip("\n") + "\n" == render_table()


def test_produce() -> None:
    produce = API_CHECKS[0]
    _has(produce, R.TOPIC, Op.WRITE, 29, on="each topic")
    txn = _has(produce, R.TRANSACTIONAL_ID, Op.WRITE, 53)
    assert "transactional" in txn.when


def test_fetch_and_offsets() -> None:
    _has(API_CHECKS[1], R.TOPIC, Op.READ, 29, on="each topic")
    _has(API_CHECKS[1], R.CLUSTER, Op.CLUSTER_ACTION, 29)  # a follower's denial is per topic
    _has(API_CHECKS[2], R.TOPIC, Op.DESCRIBE, 29)
    commit = API_CHECKS[8]
    assert commit.checks[0] == Check(R.GROUP, Op.READ, "request's group", 30)
    _has(commit, R.TOPIC, Op.READ, 29, on="each topic")
    _has(API_CHECKS[9], R.GROUP, Op.DESCRIBE, 30)
    _has(API_CHECKS[9], R.TOPIC, Op.DESCRIBE, 0)  # all offsets: silently filtered


@pytest.mark.parametrize("key", [11, 12, 13, 14])
def test_group_membership_needs_read_on_the_group(key: int) -> None:
    assert API_CHECKS[key].checks == (Check(R.GROUP, Op.READ, "request's group", 30),)


def test_init_producer_id() -> None:
    entry = API_CHECKS[22]
    _has(entry, R.TRANSACTIONAL_ID, Op.WRITE, 53, when="transactional_id set")
    idempotent = _has(entry, R.CLUSTER, Op.IDEMPOTENT_WRITE, 31)
    alternative = entry.checks[entry.checks.index(idempotent) + 1]
    assert alternative.or_else and alternative.resource is R.TOPIC
    assert alternative.operation is Op.WRITE and alternative.denied == 31
    assert "authorizeByResourceType" in entry.note


def test_create_topics_alternatives() -> None:
    entry = API_CHECKS[19]
    assert entry.checks[0] == Check(R.CLUSTER, Op.CREATE, "the cluster", 29)
    assert entry.checks[1] == Check(R.TOPIC, Op.CREATE, "each topic", 29, or_else=True)
    metadata = API_CHECKS[3]
    create = _has(metadata, R.CLUSTER, Op.CREATE, 29)
    assert metadata.checks[metadata.checks.index(create) + 1].or_else
    _has(metadata, R.TOPIC, Op.DESCRIBE, 0)  # listing all topics hides the others


def test_configs() -> None:
    for key in (33, 44):
        _has(API_CHECKS[key], R.TOPIC, Op.ALTER_CONFIGS, 29)
        _has(API_CHECKS[key], R.CLUSTER, Op.ALTER_CONFIGS, 31)
    _has(API_CHECKS[32], R.TOPIC, Op.DESCRIBE_CONFIGS, 29)
    _has(API_CHECKS[32], R.CLUSTER, Op.DESCRIBE_CONFIGS, 31)
    _has(API_CHECKS[32], R.GROUP, Op.DESCRIBE_CONFIGS, 30)


def test_transactions() -> None:
    _has(API_CHECKS[26], R.TRANSACTIONAL_ID, Op.WRITE, 53)
    txn_commit = API_CHECKS[28]
    assert [c.resource for c in txn_commit.checks] == [R.TRANSACTIONAL_ID, R.GROUP, R.TOPIC]
    _has(API_CHECKS[25], R.GROUP, Op.READ, 30)


def test_the_proxys_own_apis() -> None:
    assert {k for k, e in API_CHECKS.items() if e.audience == "proxy"} == {29, 30, 31, 48, 49}
    _has(API_CHECKS[48], R.CLUSTER, Op.DESCRIBE_CONFIGS, 31)
    _has(API_CHECKS[49], R.CLUSTER, Op.ALTER_CONFIGS, 31)
    _has(API_CHECKS[29], R.CLUSTER, Op.DESCRIBE, 31)
    _has(API_CHECKS[30], R.CLUSTER, Op.ALTER, 31)


def test_broker_apis_ask_cluster_action() -> None:
    brokers = [e for e in API_CHECKS.values() if e.audience == "broker"]
    assert {e.api_key for e in brokers} >= {52, 53, 54, 56, 58, 62, 63, 67, 70, 73, 83}
    for entry in brokers:
        assert any(c.resource is R.CLUSTER and c.operation is Op.CLUSTER_ACTION
                   for c in entry.checks) or "CLUSTER_ACTION" in entry.note, entry.name


def test_no_acl_apis() -> None:
    for key in (17, 18, 36):
        assert API_CHECKS[key].checks == ()
