"""Configuration of the connection-creation rates (KIP-612): ``quotas.ip_entities`` and the
listener kinds' ``max_connection_creation_rate``. One test per validation rule, each error at
its field's line and column; then how the ip entities join the client quota entities (the
admin APIs' view, the overrides) and what a reload may change live."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.config.schema import QuotasConfig
from kafka_quota_proxy.proxy.features.connection_rates import ip_quotas, listeners_without_rates
from kafka_quota_proxy.quota.connection_rate import address_of
from testkit import config_errors

SOURCE = "rates.yaml"

# Line numbers: 1 listeners  2 bootstrap  3 advertised_host  4 broker_ports  5 upstream
#   6 bootstrap_servers  7 quotas  8 ip_entities  9 first entity
BASE = config_errors.BASE + """\
quotas:
  ip_entities:
"""


def error(text: str) -> dict[str, Any]:
    return config_errors.single_error(text, SOURCE)


def ip_error(entity: str) -> dict[str, Any]:
    return error(BASE + f"    - {entity}\n")


def test_valid_ip_entities_and_listener_rates() -> None:
    config = parse_config(BASE.replace("  broker_ports", "  max_connection_creation_rate: 50\n"
                                       "  broker_ports") + """\
    - {ip: "<default>", connection_creation_rate: 10}
    - {ip: 10.0.0.1, connection_creation_rate: 2147483647}
    - {ip: "2001:db8::7", connection_creation_rate: 1}
""", SOURCE)
    assert config.listeners.max_connection_creation_rate == 50
    quotas = ip_quotas(config.quotas)
    assert quotas.default == 10
    assert quotas.rates == {address_of("10.0.0.1"): 2147483647, address_of("2001:db8::7"): 1}


# --- quotas.ip_entities ---------------------------------------------------------------------

def test_ip_must_be_an_address_or_default() -> None:
    e = ip_error("{ip: kafka.example, connection_creation_rate: 5}")
    assert (e["line"], e["col"], e["path"]) == (9, 8, "quotas.ip_entities.0.ip")
    assert "'kafka.example' is not an IP address" in e["msg"]
    assert "host names are not resolved" in e["msg"]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_connection_creation_rate_must_be_greater_than_zero(value: str) -> None:
    e = ip_error(f"{{ip: 10.0.0.1, connection_creation_rate: {value}}}")
    assert (e["line"], e["col"]) == (9, 22)
    assert e["path"] == "quotas.ip_entities.0.connection_creation_rate"
    assert e["msg"] == "Input should be greater than 0"


def test_connection_creation_rate_is_an_int() -> None:
    e = ip_error("{ip: 10.0.0.1, connection_creation_rate: 2.5}")
    assert e["path"] == "quotas.ip_entities.0.connection_creation_rate"
    assert "fractional part" in e["msg"]


def test_connection_creation_rate_fits_an_int() -> None:
    e = ip_error("{ip: 10.0.0.1, connection_creation_rate: 2147483648}")
    assert e["path"] == "quotas.ip_entities.0.connection_creation_rate"
    assert e["msg"] == "Input should be less than or equal to 2147483647"


@pytest.mark.parametrize("key", ["user", "client-id", "producer_byte_rate", "request_percentage"])
def test_an_ip_entity_names_nothing_else_and_carries_no_other_quota(key: str) -> None:
    e = ip_error(f"{{ip: 10.0.0.1, connection_creation_rate: 5, {key}: 7}}")
    assert (e["path"], e["msg"]) == (f"quotas.ip_entities.0.{key}", "unknown key")


@pytest.mark.parametrize(("entity", "missing"), [
    ("{connection_creation_rate: 5}", "ip"), ("{ip: 10.0.0.1}", "connection_creation_rate")])
def test_ip_and_rate_are_required(entity: str, missing: str) -> None:
    e = ip_error(entity)
    assert (e["path"], e["msg"]) == (f"quotas.ip_entities.0.{missing}",
                                     "required field is missing")


@pytest.mark.parametrize(("first", "second"), [
    ('"10.0.0.1"', '"::ffff:10.0.0.1"'), ('"2001:db8::7"', '"2001:DB8:0::7"'),
    ('"<default>"', '"<default>"')])
def test_an_address_is_configured_once(first: str, second: str) -> None:
    e = error(BASE + f"""\
    - {{ip: {first}, connection_creation_rate: 5}}
    - {{ip: {second}, connection_creation_rate: 6}}
""")
    assert (e["line"], e["col"], e["path"]) == (10, 8, "quotas.ip_entities.1.ip")
    assert e["msg"].endswith("is already configured at quotas.ip_entities.0")


def test_an_ip_in_entities_points_at_ip_entities() -> None:
    e = error(BASE.replace("  ip_entities:\n", "  entities:\n") +
              "    - {user: alice, producer_byte_rate: 5}\n"
              "    - {ip: 10.0.0.1, connection_creation_rate: 5}\n")
    assert (e["line"], e["path"]) == (8, "quotas.entities")
    assert e["msg"] == ("quotas.entities.1 names an ip: ip entities go in "
                        "quotas.ip_entities")


# --- max_connection_creation_rate of a listener kind (C9) -----------------------------------

@pytest.mark.parametrize("value", ["0", "-1"])
def test_c9_listener_rate_must_be_greater_than_zero(value: str) -> None:
    e = error(BASE.replace("quotas:\n  ip_entities:\n", "").replace(
        "  broker_ports", f"  max_connection_creation_rate: {value}\n  broker_ports"))
    assert (e["line"], e["col"]) == (4, 3)
    assert (e["path"], e["msg"]) == ("listeners.max_connection_creation_rate",
                                     "Input should be greater than 0")


def test_c9_extra_listener_rate_must_be_greater_than_zero() -> None:
    e = error(BASE.replace("quotas:\n  ip_entities:\n", "").replace("upstream:", """\
  extra:
    - {name: LB, bootstrap: "127.0.0.1:9392", broker_ports: "9393-9492",
       max_connection_creation_rate: 0}
upstream:"""))
    assert (e["line"], e["path"]) == (7, "listeners.extra.0.max_connection_creation_rate")
    assert e["msg"] == "Input should be greater than 0"


def test_listener_rate_is_an_int_that_fits() -> None:
    for value, msg in (("1.5", "fractional part"), ("2147483648", "less than or equal")):
        e = error(BASE.replace("quotas:\n  ip_entities:\n", "").replace(
            "  broker_ports", f"  max_connection_creation_rate: {value}\n  broker_ports"))
        assert e["path"] == "listeners.max_connection_creation_rate" and msg in e["msg"]


# --- the ip entities among the client quota entities ---------------------------------------

def _quotas() -> QuotasConfig:
    return QuotasConfig.model_validate({
        "entities": [{"user": "alice", "producer_byte_rate": 100}],
        "ip_entities": [{"ip": "<default>", "connection_creation_rate": 5},
                        {"ip": "10.0.0.1", "connection_creation_rate": 7}]})


def test_ip_entities_are_client_quota_entities() -> None:
    """DescribeClientQuotas shows them (``static_quotas``), as Kafka's ip entities."""
    assert _quotas().static_quotas() == {
        (("user", "alice"),): {"producer_byte_rate": 100.0},
        (("ip", None),): {"connection_creation_rate": 5.0},
        (("ip", "10.0.0.1"),): {"connection_creation_rate": 7.0}}


def test_altered_ip_quotas_merge_over_the_file() -> None:
    merged = _quotas().with_overrides({
        (("ip", "10.0.0.1"),): {"connection_creation_rate": 9.0},
        (("ip", "10.0.0.2"),): {"connection_creation_rate": 1.0}})
    quotas = ip_quotas(merged)
    assert quotas.default == 5
    assert quotas.rates == {address_of("10.0.0.1"): 9, address_of("10.0.0.2"): 1}
    assert [e.model_dump(by_alias=True, exclude_none=True) for e in merged.entities] == [
        {"user": "alice", "producer_byte_rate": 100}]
    assert merged.settings() == _quotas().settings()  # byte-rate quotas untouched


def test_a_reload_of_listener_rates_alone_changes_nothing_else() -> None:
    one = parse_config(BASE.replace("quotas:\n  ip_entities:\n", ""), SOURCE).listeners
    two = one.model_copy(update={"max_connection_creation_rate": 30})
    assert one != two
    assert listeners_without_rates(one) == listeners_without_rates(two)
    three = one.model_copy(update={"advertised_host": "other"})
    assert listeners_without_rates(one) != listeners_without_rates(three)
