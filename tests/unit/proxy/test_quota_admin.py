"""DescribeClientQuotas and AlterClientQuotas answered by the proxy
(``proxy.features.quota_admin``): authorization, answers, responses held until an alter is
stored, and the overrides read from the topic. Kafka's validation rules themselves are
``tests/unit/quota/test_client_quotas.py``'s."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol.correlation import CorrelationTable, InFlight
from kafka_quota_proxy.protocol.headers import (
    encode_request_header,
    parse_request_header,
    parse_response_header,
)
from kafka_quota_proxy.protocol.request_stream import RequestStream
from kafka_quota_proxy.proxy.connection import read_events
from kafka_quota_proxy.proxy.features.quota_admin.admin import AlterFailed, ClientQuotaAdmin
from kafka_quota_proxy.proxy.features.quota_admin.filter import QuotaAdminFilter
from kafka_quota_proxy.quota.client_quotas import Change, encode_record
from testkit.filter_host import FakeFilterHost
from testkit.frames import request_frame

ALICE = (("user", "alice"),)


def _admin(**quotas: Any) -> tuple[ClientQuotaAdmin, list[int]]:
    config = QuotasConfig.model_validate({
        "admin_principals": ["User:admin"], "describe_principals": ["viewer"],
        "entities": [{"user": "alice", "producer_byte_rate": 1000}], **quotas})
    changed: list[int] = []
    admin = ClientQuotaAdmin(lambda: config, [], lambda: changed.append(1))
    return admin, changed


def _frame(api_key: int, version: int, value: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(value))(buf, value)
    return encode_request_header(api_key, version, 11, "admin-client") + buf.getvalue()


def _describe(components: list[tuple[str, int, str | None]], strict: bool = False,
              version: int = 1) -> bytes:
    cls = load_request_schema(48, version)
    mod = __import__(cls.__module__, fromlist=["ComponentData"])
    return _frame(48, version, cls(components=tuple(
        mod.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components),
        strict=strict))


def _alter(entries: list[tuple[list[tuple[str, str | None]], list[tuple[str, float, bool]]]],
           validate_only: bool = False, version: int = 1) -> bytes:
    cls = load_request_schema(49, version)
    mod = __import__(cls.__module__, fromlist=["EntryData", "EntityData", "OpData"])
    return _frame(49, version, cls(entries=tuple(
        mod.EntryData(entity=tuple(mod.EntityData(entity_type=t, entity_name=n) for t, n in e),
                      ops=tuple(mod.OpData(key=k, value=v, remove=r) for k, v, r in ops))
        for e, ops in entries), validate_only=validate_only))


def _answer(entry: InFlight) -> Any:
    assert entry.answer is not None
    frame = entry.answer
    header = parse_response_header(frame, 0, len(frame),
                                   apis.response_header_version(entry.api_key,
                                                                entry.api_version))
    assert header.correlation_id == entry.correlation_id
    value, _ = entity_reader(load_response_schema(entry.api_key, entry.api_version))(
        memoryview(frame)[header.size:], 0)
    return value


def _run(f: QuotaAdminFilter, frame: bytes) -> InFlight:
    header = parse_request_header(frame, 0, len(frame))
    entry = InFlight(header.api_key, header.api_version, header.correlation_id,
                     header.client_id, len(frame) + 4, True)
    assert f.request_frame(entry, frame, True) is None  # never replaced: answered
    return entry


@pytest.mark.parametrize("user", ["admin", "viewer"])
def test_describe_answers_the_merged_view_to_allowed_principals(user: str) -> None:
    admin, _ = _admin()
    admin.overrides = {(("user", "bob"),): {"consumer_byte_rate": 5.0},
                       ALICE: {"request_percentage": 20.0}}
    value = _answer(_run(QuotaAdminFilter(FakeFilterHost(user), admin),
                         _describe([("user", 2, None)])))
    assert (value.error_code, value.error_message) == (0, None)
    got = {tuple((c.entity_type, c.entity_name) for c in e.entity):
           {v.key: v.value for v in e.values} for e in value.entries}
    assert got == {ALICE: {"producer_byte_rate": 1000.0, "request_percentage": 20.0},
                   (("user", "bob"),): {"consumer_byte_rate": 5.0}}
    assert admin.describes == {"answered": 1, "refused": 0}


async def test_ip_entities_are_described_and_altered() -> None:
    """KIP-612: ``ip`` entities (the file's ``ip_entities`` and altered ones) are Kafka's third
    entity type, with connection_creation_rate; an alter of one is stored and applied."""
    admin, changed = _admin(ip_entities=[{"ip": "<default>", "connection_creation_rate": 5}])
    written: list[list[Change]] = []

    async def write(changes: list[Change], principal: str) -> None:
        written.append(changes)
        admin._apply(changes)

    admin.write = write  # type: ignore[method-assign]
    host = FakeFilterHost("admin")
    value = _answer(_run(QuotaAdminFilter(host, admin), _describe([("ip", 2, None)])))
    assert (value.error_code, value.error_message) == (0, None)
    assert [([(c.entity_type, c.entity_name) for c in e.entity],
             [(v.key, v.value) for v in e.values]) for e in value.entries] == [
        ([("ip", None)], [("connection_creation_rate", 5.0)])]
    entry = _run(QuotaAdminFilter(host, admin), _alter([
        ([("ip", "10.0.0.1")], [("connection_creation_rate", 2.0, False)]),
        ([("ip", "10.0.0.2"), ("user", "bob")], [("connection_creation_rate", 2.0, False)])]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert [(e.error_code, e.error_message) for e in _answer(entry).entries] == [
        (0, None), (42, "Invalid quota entity combination, IP entity shouldnot be combined "
                        "with User or ClientId")]
    assert written == [[Change((("ip", "10.0.0.1"),), "connection_creation_rate", 2.0)]]
    assert admin.overrides == {(("ip", "10.0.0.1"),): {"connection_creation_rate": 2.0}}
    assert changed == [1]
    merged = admin.config.with_overrides(admin.overrides)
    assert {(e.ip, e.connection_creation_rate) for e in merged.ip_entities} == {
        ("<default>", 5), ("10.0.0.1", 2)}


def test_describe_refused_to_other_principals() -> None:
    admin, _ = _admin()
    value = _answer(_run(QuotaAdminFilter(FakeFilterHost("mallory"), admin), _describe([])))
    # (Kafka's answer carries the error's message)
    assert (value.error_code, value.error_message, value.entries) == (
        31, "Cluster authorization failed.", None)
    assert admin.describes["refused"] == 1


@pytest.mark.parametrize("version", [0, 1])
def test_a_bad_filter_is_the_top_level_error(version: int) -> None:
    admin, _ = _admin()
    entry = _run(QuotaAdminFilter(FakeFilterHost("admin"), admin),
                 _describe([("user", 0, None)], version=version))
    value = _answer(entry)
    assert value.error_code == 42 and value.entries is None
    assert value.error_message == ("Request specified MATCH_TYPE_EXACT, but set match string "
                                   "to null.")


def test_alter_refused_per_entry_to_principals_not_admins() -> None:
    admin, _ = _admin()
    host = FakeFilterHost("viewer")
    value = _answer(_run(QuotaAdminFilter(host, admin), _alter([
        ([("user", "bob")], [("producer_byte_rate", 10.0, False)]),
        ([("client-id", None)], [("consumer_byte_rate", 10.0, False)])])))
    assert [(e.error_code, e.error_message, [(c.entity_type, c.entity_name) for c in e.entity])
            for e in value.entries] == [
        (31, "Cluster authorization failed.", [("user", "bob")]),
        (31, "Cluster authorization failed.", [("client-id", None)])]
    assert admin.overrides == {} and host.holds == []
    assert admin.alters["unauthorized"] == 2 and admin.alters["applied"] == 0


def test_validate_only_answers_and_changes_nothing() -> None:
    admin, changed = _admin()
    host = FakeFilterHost("admin")
    value = _answer(_run(QuotaAdminFilter(host, admin), _alter([
        ([("user", "bob")], [("producer_byte_rate", 10.0, False)]),
        ([("user", "eve")], [("producer_byte_rate", 1.5, False)])], validate_only=True)))
    assert [(e.error_code, e.error_message) for e in value.entries] == [
        (0, None), (42, "producer_byte_rate cannot be a fractional value.")]
    assert admin.overrides == {} and changed == [] and host.holds == []
    assert (admin.alters["validated"], admin.alters["invalid"]) == (1, 1)


def test_alters_refused_when_overrides_are_disabled() -> None:
    admin, _ = _admin(overrides={"enabled": False})
    value = _answer(_run(QuotaAdminFilter(FakeFilterHost("admin"), admin), _alter([
        ([("user", "bob")], [("producer_byte_rate", 10.0, False)])])))
    assert value.entries[0].error_code == 42
    assert "quotas.overrides.enabled is false" in value.entries[0].error_message


async def test_an_alter_holds_the_responses_until_it_is_stored() -> None:
    admin, _ = _admin()
    written = asyncio.Event()
    stored: list[list[Change]] = []

    async def write(changes: list[Change], principal: str) -> None:
        await written.wait()
        stored.append(changes)
        admin._apply(changes)

    admin.write = write  # type: ignore[method-assign]
    host = FakeFilterHost("admin")
    entry = _run(QuotaAdminFilter(host, admin), _alter([
        ([("user", "bob")], [("producer_byte_rate", 10.0, False)])]))
    assert host.holds == ["quota_alter:11"] and host.released == []
    await asyncio.sleep(0)
    assert stored == []  # not yet: the responses still wait
    written.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert stored == [[Change((("user", "bob"),), "producer_byte_rate", 10.0)]]
    assert host.released == ["quota_alter:11"]
    assert [(e.error_code, e.error_message) for e in _answer(entry).entries] == [(0, None)]
    assert admin.overrides == {(("user", "bob"),): {"producer_byte_rate": 10.0}}


async def test_an_alter_that_cannot_be_stored_answers_an_error() -> None:
    admin, _ = _admin()

    async def write(changes: list[Change], principal: str) -> None:
        raise AlterFailed("KafkaTimeoutError()")

    admin.write = write  # type: ignore[method-assign]
    host = FakeFilterHost("admin")
    entry = _run(QuotaAdminFilter(host, admin), _alter([
        ([("user", "bob")], [("producer_byte_rate", 10.0, False)]),
        ([("user", "")], [("producer_byte_rate", 10.0, False)])]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert host.released == ["quota_alter:11"]
    assert [(e.error_code, e.error_message) for e in _answer(entry).entries] == [
        (-1, "the quotas could not be stored: KafkaTimeoutError()"),
        (42, "Empty user not supported")]
    assert admin.overrides == {}


def test_a_frame_that_does_not_decode_closes_the_connection() -> None:
    admin, _ = _admin()
    host = FakeFilterHost("admin")
    frame = encode_request_header(48, 1, 3, "c") + b"\x05"
    entry = InFlight(48, 1, 3, "c", len(frame) + 4, True)
    QuotaAdminFilter(host, admin).request_frame(entry, frame, True)
    assert host.close_reasons == ["malformed_frame"] and entry.answer is None


def test_an_answered_frame_goes_nowhere_even_with_a_frame_under_way_after_it() -> None:
    """The connection takes an answered frame out of what goes upstream (size prefix and
    all), marks its entry local, and the frame under way after it goes on cut-through."""
    describe = _describe([])
    produce = request_frame(0, 9, 12, "p", b"\x00" * 500)
    table = CorrelationTable()
    stream = RequestStream(table, copy_frame=lambda e: e.api_key == 48,
                           whole=lambda key, version: key == 48)
    forward, events = stream.feed(len(describe).to_bytes(4, "big") + describe + produce[:40])
    assert stream.mid_frame  # the Produce frame goes on cut-through
    admin, _ = _admin()
    f = QuotaAdminFilter(FakeFilterHost("admin"), admin)
    outcome = read_events(forward, events, f.request_frame, None, lambda e: False, table)
    assert outcome.forward is not None and bytes(outcome.forward) == produce[:40]
    answered = outcome.read[0]
    assert answered.answer is not None and answered.local and table.local == 1


def test_overrides_follow_the_topic() -> None:
    admin, changed = _admin()
    key, value = encode_record(Change(ALICE, "producer_byte_rate", 5000.0))
    admin.observe(key, value, 0)
    assert admin.overrides == {ALICE: {"producer_byte_rate": 5000.0}} and changed == [1]
    admin.observe(key, value, 0)  # the same again: nothing changes
    assert changed == [1]
    admin.observe(key, None, 0)  # a tombstone: removed
    assert admin.overrides == {} and changed == [1, 1]
    admin.observe(b"{not json", b"{}", 0)
    assert admin.bad_records == 1 and admin.records_read == 3
    merged = admin.config.with_overrides({ALICE: {"producer_byte_rate": 5000.0}})
    assert [(e.user, e.producer_byte_rate) for e in merged.entities] == [("alice", 5000)]


def test_frames_other_filters_asked_for_are_left_alone() -> None:
    """The chain's request_frame hooks see every frame captured whole, for any filter: a
    Fetch captured for fetch routing is not this filter's."""
    admin, _ = _admin()
    host = FakeFilterHost("admin")
    frame = request_frame(1, 15, 3, "consumer", b"\x00" * 60)[4:]
    entry = InFlight(1, 15, 3, "consumer", len(frame) + 4, True)
    assert QuotaAdminFilter(host, admin).request_frame(entry, frame, True) is None
    assert entry.answer is None and host.close_reasons == []


async def test_an_alter_written_here_is_in_force_before_it_is_answered() -> None:
    """The alter's answer goes out as soon as ``write`` returns: by then this proxy applies
    the new quotas (``on_change``), not a loop turn later."""
    admin, changed = _admin()

    class Producer:
        async def send(self, topic: str, value: bytes | None, key: bytes) -> Any:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    async def ready() -> Any:
        return Producer()

    admin._ready_producer = ready  # type: ignore[method-assign]
    await admin.write([Change((("user", "bob"),), "producer_byte_rate", 10.0)], "admin")
    assert changed == [1]
    assert admin.overrides == {(("user", "bob"),): {"producer_byte_rate": 10.0}}
    await asyncio.sleep(0)
    assert changed == [1]  # (once)


async def test_alters_are_counted_per_entity_by_outcome() -> None:
    """2 entities applied, 1 unchanged and 3 invalid in one request count as such (the
    counter once read 5 "applied" after 2 valid alters and 3 refused ones)."""
    admin, _ = _admin()
    admin._apply([Change((("user", "same"),), "producer_byte_rate", 10.0)])

    async def write(changes: list[Change], principal: str) -> None:
        admin._apply(changes)

    admin.write = write  # type: ignore[method-assign]
    host = FakeFilterHost("admin")
    _run(QuotaAdminFilter(host, admin), _alter([
        ([("user", "bob")], [("producer_byte_rate", 10.0, False)]),
        ([("user", "eve")], [("producer_byte_rate", 20.0, False)]),
        ([("user", "same")], [("producer_byte_rate", 10.0, False)]),
        ([("user", "x")], [("producer_byte_rate", 1.5, False)]),
        ([("user", "")], [("producer_byte_rate", 1.0, False)]),
        ([("ip", "10.0.0.2"), ("user", "y")], [("connection_creation_rate", 2.0, False)])]))
    for _ in range(5):
        await asyncio.sleep(0)
    assert {k: v for k, v in admin.alters.items() if v} == {
        "applied": 2, "unchanged": 1, "invalid": 3}
