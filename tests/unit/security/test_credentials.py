"""The credentials file of a proxy that terminates SASL (``security/credentials.py``): parsing
and its positioned errors, ``add_user`` (salted, never the password), PLAIN checked against
the SCRAM credentials, and a SCRAM exchange against what ``add_user`` wrote."""

from __future__ import annotations

import base64
import re

import pytest
import yaml

from kafka_quota_proxy.security.credentials import MECHANISMS, Credentials, add_user, fingerprint
from kafka_quota_proxy.security.sasl import SaslError
from kafka_quota_proxy.security.scram import (
    MIN_ITERATIONS,
    ScramClient,
    ScramServer,
    format_credential,
    make_credential,
    parse_credential,
)

# The least Kafka accepts keeps PBKDF2 fast.
FAST = MIN_ITERATIONS
GOOD = format_credential(make_credential("SCRAM-SHA-256", "pw", b"some-salt", FAST))


def file_of(**users: dict[str, str]) -> str:
    return yaml.safe_dump({"users": users})


def with_user(user: str, password: str, text: str = "") -> Credentials:
    return Credentials.parse(add_user(text, user, password, FAST))


# ------------------------------------------------------------------ parse


@pytest.mark.parametrize("text", ["", "   \n", "users: {}\n", "users:\n", "# nothing\n"])
def test_parse_empty_file_has_no_users(text: str) -> None:
    assert Credentials.parse(text).users == {}


def test_parse_reads_each_mechanism() -> None:
    c512 = make_credential("SCRAM-SHA-512", "pw", b"salt-512", FAST)
    text = file_of(alice={"SCRAM-SHA-512": format_credential(c512), "SCRAM-SHA-256": GOOD})
    creds = Credentials.parse(text)
    assert set(creds.users) == {"alice"}
    assert creds.scram("SCRAM-SHA-512", "alice") == c512
    assert creds.scram("SCRAM-SHA-256", "alice") == parse_credential(GOOD)


@pytest.mark.parametrize(
    ("users", "where"),
    [
        ({"alice": {"SCRAM-SHA-1": GOOD}}, "users.alice.SCRAM-SHA-1"),
        ({"alice": {"PLAIN": "secret"}}, "users.alice.PLAIN"),
        ({"alice": {"SCRAM-SHA-256": "salt=c2FsdA==,iterations=4096"}},
         "users.alice.SCRAM-SHA-256"),
        ({"bob": {"SCRAM-SHA-512": GOOD.replace("iterations=4096", "iterations=many")}},
         "users.bob.SCRAM-SHA-512"),
        ({"bob": {"SCRAM-SHA-512": GOOD.replace("salt=", "salt=!!")}},
         "users.bob.SCRAM-SHA-512"),
        ({"ok": {"SCRAM-SHA-256": GOOD}, "carol": {"SCRAM-SHA-256": "nonsense"}},
         "users.carol.SCRAM-SHA-256"),
    ],
)
def test_parse_error_names_user_and_mechanism(users: dict[str, dict[str, str]],
                                              where: str) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(where)}: "):
        Credentials.parse(file_of(**users))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("users: {dave: {}}\n", "users.dave: expected"),
        ("users: {dave: SCRAM-SHA-256}\n", "users.dave: expected"),
        ("users: [alice]\n", "users: expected a mapping"),
        ("people: {}\n", "one key, users"),
        ("users: {}\nextra: 1\n", "one key, users"),
        ("- users\n", "one key, users"),
        ('users: {"": {SCRAM-SHA-256: x}}\n', "is not a user name"),
        ("users: {1: {SCRAM-SHA-256: x}}\n", "is not a user name"),
    ],
)
def test_parse_shape_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        Credentials.parse(text)


def test_parse_yaml_syntax_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        Credentials.parse("users: [unclosed\n")


def test_scram_lookup_misses() -> None:
    creds = Credentials.parse(file_of(alice={"SCRAM-SHA-256": GOOD}))
    assert creds.scram("SCRAM-SHA-256", "alice") is not None
    assert creds.scram("SCRAM-SHA-512", "alice") is None  # mechanism not held
    assert creds.scram("SCRAM-SHA-256", "mallory") is None  # unknown user


# ------------------------------------------------------------------ add_user


def salts(text: str, user: str) -> dict[str, bytes]:
    held = Credentials.parse(text).users[user]
    return {m: c.salt for m, c in held.items()}


def test_add_user_to_empty_file_writes_every_mechanism() -> None:
    text = add_user("", "alice", "pa55word", FAST)
    held = Credentials.parse(text).users["alice"]
    assert set(held) == set(MECHANISMS) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert all(c.iterations == FAST for c in held.values())
    # the stored form is Kafka's credential text
    raw = yaml.safe_load(text)["users"]["alice"]
    for mechanism, value in raw.items():
        assert parse_credential(value) == held[mechanism]
        assert re.fullmatch(r"salt=[^,]+,stored_key=[^,]+,server_key=[^,]+,iterations=4096",
                            value)


def test_add_user_default_iterations() -> None:
    held = Credentials.parse(add_user("", "alice", "pw")).users["alice"]
    assert {c.iterations for c in held.values()} == {8192}


def test_add_user_never_writes_the_password() -> None:
    password = "Sup3r-S3cret-Passw0rd"
    text = add_user("", "alice", password, FAST)
    text = add_user(text, "bob", password + "-bob", FAST)
    assert password not in text
    for encoded in (password.encode(), base64.b64encode(password.encode())):
        assert encoded.decode() not in text
    # and the credentials still know it
    creds = Credentials.parse(text)
    assert creds.check_plain("alice", password)
    assert creds.check_plain("bob", password + "-bob")


def test_add_user_keeps_other_users() -> None:
    first = add_user("", "alice", "a-pw", FAST)
    second = add_user(first, "bob", "b-pw", FAST)
    before, after = Credentials.parse(first), Credentials.parse(second)
    assert set(after.users) == {"alice", "bob"}
    assert after.users["alice"] == before.users["alice"]  # untouched, byte for byte
    assert yaml.safe_load(second)["users"]["alice"] == yaml.safe_load(first)["users"]["alice"]
    assert after.check_plain("alice", "a-pw") and after.check_plain("bob", "b-pw")


def test_add_user_keeps_a_user_with_one_mechanism() -> None:
    text = add_user(file_of(carol={"SCRAM-SHA-256": GOOD}), "dave", "d-pw", FAST)
    creds = Credentials.parse(text)
    assert set(creds.users["carol"]) == {"SCRAM-SHA-256"}
    assert creds.check_plain("carol", "pw")


def test_add_user_replaces_the_user() -> None:
    text = add_user("", "alice", "old-pw", FAST)
    text = add_user(text, "bob", "b-pw", FAST)
    replaced = add_user(text, "alice", "new-pw", FAST)
    creds = Credentials.parse(replaced)
    assert set(creds.users) == {"alice", "bob"}
    assert creds.check_plain("alice", "new-pw")
    assert not creds.check_plain("alice", "old-pw")
    assert creds.users["bob"] == Credentials.parse(text).users["bob"]
    assert replaced.count("alice:") == 1


def test_add_user_salts_differ_per_mechanism_and_per_call() -> None:
    first = salts(add_user("", "alice", "same", FAST), "alice")
    second = salts(add_user("", "alice", "same", FAST), "alice")
    assert first["SCRAM-SHA-256"] != first["SCRAM-SHA-512"]
    assert first["SCRAM-SHA-256"] != second["SCRAM-SHA-256"]
    assert first["SCRAM-SHA-512"] != second["SCRAM-SHA-512"]
    assert all(len(s) >= 16 for s in (*first.values(), *second.values()))
    # two users with the same password get different salts (and so different keys)
    both = Credentials.parse(add_user(add_user("", "a", "same", FAST), "b", "same", FAST))
    for mechanism in MECHANISMS:
        a, b = both.scram(mechanism, "a"), both.scram(mechanism, "b")
        assert a is not None and b is not None
        assert a.salt != b.salt and a.stored_key != b.stored_key


@pytest.mark.parametrize("broken", [
    "users: {alice: {SCRAM-SHA-256: nonsense}}\n",
    "users: {alice: {SCRAM-SHA-1: x}}\n",
    "people: {}\n",
])
def test_add_user_refuses_a_broken_file(broken: str) -> None:
    with pytest.raises(ValueError):
        add_user(broken, "bob", "pw", FAST)


def test_add_user_refuses_too_few_iterations() -> None:
    with pytest.raises(ValueError, match="at least 4096"):
        add_user("", "alice", "pw", FAST - 1)


# ------------------------------------------------------------------ check_plain


def test_check_plain() -> None:
    creds = with_user("alice", "right")
    assert creds.check_plain("alice", "right") is True
    assert creds.check_plain("alice", "wrong") is False
    assert creds.check_plain("alice", "") is False
    assert creds.check_plain("alice", "right ") is False
    assert creds.check_plain("mallory", "right") is False
    assert creds.check_plain("ALICE", "right") is False


def test_check_plain_non_ascii_password() -> None:
    creds = with_user("zoë", "pässwörd-✓")
    assert creds.check_plain("zoë", "pässwörd-✓")
    assert not creds.check_plain("zoë", "passwo\u0308rd-✓")  # no SASLprep, as Kafka


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_check_plain_with_one_scram_mechanism(mechanism: str) -> None:
    credential = make_credential(mechanism, "only-one", b"salt-x", FAST)
    creds = Credentials.parse(file_of(erin={mechanism: format_credential(credential)}))
    assert creds.check_plain("erin", "only-one")
    assert not creds.check_plain("erin", "only-two")


def test_check_plain_uses_the_strongest_mechanism() -> None:
    text = file_of(frank={
        "SCRAM-SHA-512": format_credential(make_credential("SCRAM-SHA-512", "p512", b"s1", FAST)),
        "SCRAM-SHA-256": format_credential(make_credential("SCRAM-SHA-256", "p256", b"s2", FAST)),
    })
    creds = Credentials.parse(text)
    assert creds.check_plain("frank", "p512")
    assert not creds.check_plain("frank", "p256")


WEAK = "salt=c2FsdA==,stored_key=AAAA,server_key=AAAA,iterations=100"


def test_a_file_with_too_few_iterations_is_refused() -> None:
    with pytest.raises(ValueError, match=r"users\.gina\.SCRAM-SHA-256: iterations 100 is "
                       r"below 4096"):
        Credentials.parse(file_of(gina={"SCRAM-SHA-256": WEAK}))


def test_check_plain_with_too_few_iterations_is_false_not_an_error() -> None:
    creds = Credentials({"gina": {"SCRAM-SHA-256": parse_credential(WEAK)}})
    assert creds.check_plain("gina", "anything") is False


# ------------------------------------------------------------------ SCRAM against add_user


def exchange(creds: Credentials, mechanism: str, user: str, password: str) -> None:
    """One SCRAM exchange, ``Credentials.scram`` as the server's lookup; SaslError if it
    fails."""
    client = ScramClient(mechanism, user, password, "clientnonce123")
    server = ScramServer(mechanism, lambda u: creds.scram(mechanism, u), "servernonce456")
    client_final = client.final(server.first(client.first()))
    client.verify(server.final(client_final))
    assert server.complete
    assert server.username == user


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_with_add_user_credentials(mechanism: str) -> None:
    creds = with_user("alice", "s3cret", add_user("", "bob", "other", FAST))
    exchange(creds, mechanism, "alice", "s3cret")
    exchange(creds, mechanism, "bob", "other")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_fails_with_wrong_password_or_user(mechanism: str) -> None:
    creds = with_user("alice", "s3cret")
    with pytest.raises(SaslError) as info:
        exchange(creds, mechanism, "alice", "not-it")
    assert info.value.reason == "authentication_failed"
    with pytest.raises(SaslError) as info:
        exchange(creds, mechanism, "mallory", "s3cret")
    assert info.value.reason == "authentication_failed"


def test_scram_exchange_fails_after_the_user_is_replaced() -> None:
    creds = Credentials.parse(add_user(add_user("", "alice", "old", FAST), "alice", "new", FAST))
    exchange(creds, "SCRAM-SHA-512", "alice", "new")
    with pytest.raises(SaslError):
        exchange(creds, "SCRAM-SHA-512", "alice", "old")


# ------------------------------------------------------------------ fingerprint


def test_fingerprint() -> None:
    text = add_user("", "alice", "pw", FAST)
    assert re.fullmatch(r"[0-9a-f]{12}", fingerprint(text))
    assert fingerprint(text) == fingerprint(str(text))
    assert fingerprint(text) != fingerprint(text + "\n")
    assert fingerprint(text) != fingerprint(add_user("", "alice", "pw", FAST))  # new salts
    assert fingerprint("") == "e3b0c44298fc"  # sha256 of nothing
