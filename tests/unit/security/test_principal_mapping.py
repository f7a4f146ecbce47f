"""Kafka's ``ssl.principal.mapping.rules``: Kafka's own SslPrincipalMapperTest cases, then the
Java behaviours the port keeps (replaceAll, back references, Java regex syntax)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_quota_proxy.security.principal_mapping import (
    DEFAULT_RULES,
    NoMatchingRule,
    PrincipalMapper,
)

# --- Kafka's SslPrincipalMapperTest --------------------------------------------------------


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules: str) -> None:
    PrincipalMapper.parse(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
    ],
)
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(ValueError, match=r"^Invalid rule: `"):
        PrincipalMapper.parse(rules)


def test_ssl_principal_mapper() -> None:
    mapper = PrincipalMapper.parse(
        ", ".join(
            [
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
                "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
                "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
                "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
                "DEFAULT",
            ]
        )
    )
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert (
        mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    )


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ("", ()),
        ("DEFAULT", ("DEFAULT",)),
        ("RULE://", ("RULE:/",)),
        ("RULE:/.*/", ("RULE:/.*",)),
        ("RULE:/.*/L", ("RULE:/.*/L",)),
        ("RULE://,DEFAULT", ("RULE:/", "DEFAULT")),
        ("  RULE:// ,  DEFAULT  ", ("RULE:/", "DEFAULT")),
        ("  RULE:   /     / ,  DEFAULT  ", ("RULE:   /     ", "DEFAULT")),
        ("  RULE:  /     /U   ,DEFAULT  ", ("RULE:  /     /U", "DEFAULT")),
        (
            "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
            ("RULE:([A-Z]*)/$1/U", "RULE:([a-z]+)/$1", "DEFAULT"),
        ),
        # empty rules are ignored
        (",   , , ,      , , ,   ", ()),
        (",,RULE://,,,DEFAULT,,", ("RULE:/", "DEFAULT")),
        (",  , RULE: /   /    ,,,   DEFAULT, ,   ", ("RULE: /   ", "DEFAULT")),
        ("     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,", ("RULE:   /  /U", "DEFAULT")),
        # escape sequences
        (r"RULE:\/\\\(\)\n\t/\/\//", (r"RULE:\/\\\(\)\n\t/\/\/",)),
        (r"RULE:\**\/+/*/L,RULE:\/*\**/**/", (r"RULE:\**\/+/*/L", r"RULE:\/*\**/**")),
        # rules rule
        (
            r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
            r"/DEFAULT/,DEFAULT",
            (
                r"RULE:,RULE:,/,RULE:,\//U",
                "RULE:,/RULE:,",
                "RULE:,RULE:,/L,RULE:,/L",
                "RULE:, DEFAULT, /DEFAULT",
                "DEFAULT",
            ),
        ),
    ],
)
def test_rules_splitting(rules: str, expected: tuple[str, ...]) -> None:
    mapper = PrincipalMapper.parse(rules)
    assert mapper.rules == expected
    assert repr(mapper) == f"PrincipalMapper(rules = [{', '.join(expected)}])"


def test_comma_with_whitespace() -> None:
    mapper = PrincipalMapper.parse(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


# --- defaults, lists, failures -----------------------------------------------------------------


def test_no_rules_configured_is_default() -> None:
    assert PrincipalMapper.parse().rules == (DEFAULT_RULES,)
    assert PrincipalMapper.parse(None).name("CN=a,O=b") == "CN=a,O=b"


def test_empty_rules_match_nothing_as_in_kafka() -> None:
    for rules in ("", [], ["", "  "]):
        mapper = PrincipalMapper.parse(rules)
        assert mapper.rules == ()
        with pytest.raises(NoMatchingRule):
            mapper.name("CN=a")


def test_no_matching_rule_names_the_dn_and_the_rules() -> None:
    mapper = PrincipalMapper.parse("RULE:^CN=(.*)$/$1/L")
    with pytest.raises(NoMatchingRule) as raised:
        mapper.name("OU=x")
    assert str(raised.value) == "No rules apply to OU=x, rules [RULE:^CN=(.*)$/$1/L]"


def test_a_list_holds_one_rule_per_item() -> None:
    rules = ["RULE:^CN=([^,]+),OU=a$/$1/L", " RULE:^CN=([^,]+)(,.*)?$/$1/U ", "DEFAULT"]
    mapper = PrincipalMapper.parse(rules)
    assert mapper == PrincipalMapper.parse(",".join(rules))
    assert mapper.rules == (
        "RULE:^CN=([^,]+),OU=a$/$1/L",
        "RULE:^CN=([^,]+)(,.*)?$/$1/U",
        "DEFAULT",
    )
    assert mapper.name("CN=Duke,OU=a") == "duke"
    assert mapper.name("CN=Duke,OU=b") == "DUKE"
    assert mapper.name("O=x") == "O=x"


def test_a_list_item_with_two_rules_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unmatched substring: `, DEFAULT`"):
        PrincipalMapper.parse(["RULE:^CN=(.*)$/$1/, DEFAULT"])


def test_the_first_rule_that_matches_wins() -> None:
    mapper = PrincipalMapper.parse("RULE:^CN=(.*),O=a$/first/,RULE:^CN=(.*)$/second/,DEFAULT")
    assert mapper.name("CN=x,O=a") == "first"
    assert mapper.name("CN=x,O=b") == "second"
    assert mapper.name("O=c") == "O=c"


@pytest.mark.parametrize(
    ("case", "expected"), [("", "DuKe Ünï"), ("L", "duke ünï"), ("U", "DUKE ÜNÏ")]
)
def test_lower_and_upper_case_flags(case: str, expected: str) -> None:
    assert PrincipalMapper.parse(f"RULE:^CN=(.*)$/$1/{case}").name("CN=DuKe Ünï") == expected


def test_upper_case_is_the_full_unicode_mapping_like_java() -> None:
    assert PrincipalMapper.parse("RULE:^CN=(.*)$/$1/U").name("CN=straße") == "STRASSE"


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("RULE:^CN=(.*$/$1/", r"Invalid rule: `RULE:\^CN=\(\.\*\$/\$1/`, pattern `\^CN=\(\.\*\$`"),
        ("RULE:^CN=.*$/$1/", r"replacement `\$1`: No group 1"),
        ("RULE:^CN=(.*)$/$/", r"replacement `\$`: Illegal group reference"),
        ("RULE:^CN=(.*)$/${user}/", r"No group with name \{user\}"),
        ("RULE:^CN=(.*)$/$x/", r"Illegal group reference"),
        ("RULE:\\p{Lower}+/x/", r"\\p\{\.\.\.\} classes are not supported"),
        ("RULE:[a-z[0-9]]/x/", r"a class inside a class"),
        ("RULE:[a-z&&b]/x/", r"class intersection"),
        ("RULE:a)(b/x/", r"unmatched closing"),
    ],
)
def test_errors_name_the_rule_and_what_is_wrong(rules: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        PrincipalMapper.parse(f"DEFAULT, {rules}")
    assert f"`{rules}`" in str(raised.value)


# --- Java's replaceAll and back references -----------------------------------------------------


def test_every_match_is_replaced_as_java_replace_all_does() -> None:
    # ".*" matches the name, then the empty string at its end: Java gives "xx" too.
    assert PrincipalMapper.parse("RULE:.*/x/").name("CN=a") == "xx"
    assert PrincipalMapper.parse("RULE:.*/x/").name("") == "x"
    assert PrincipalMapper.parse("RULE:^.*$/x/").name("CN=a") == "x"
    assert PrincipalMapper.parse("RULE:(?:a|b)+/[$0]/").name("abab") == "[abab]"


def test_back_references() -> None:
    dn = "CN=duke,O=acme"
    assert PrincipalMapper.parse(r"RULE:^CN=(\w+),O=(\w+)$/$2:$1/").name(dn) == "acme:duke"
    assert PrincipalMapper.parse(r"RULE:^CN=(\w+),O=(\w+)$/$0/").name(dn) == dn
    # group 12 does not exist: group 1 followed by "2"
    assert PrincipalMapper.parse(r"RULE:^CN=(\w+),.*$/$12/").name(dn) == "duke2"
    # $3 is beyond the groups: Kafka makes it literal
    assert PrincipalMapper.parse(r"RULE:^CN=(\w+),O=(\w+)$/$1$3/").name(dn) == "duke$3"
    assert PrincipalMapper.parse(r"RULE:^CN=(\w+),.*$/\$1 \\ \/ $1/").name(dn) == r"$1 \ / duke"
    assert PrincipalMapper.parse(r"RULE:^CN=(?<user>\w+),.*$/${user}/U").name(dn) == "DUKE"
    # a group that did not take part is empty
    assert PrincipalMapper.parse(r"RULE:^CN=(\w+)(,OU=\w+)?,.*$/$1$2/").name(dn) == "duke"


def test_kafka_escapes_a_second_literal_back_reference_one_character_early() -> None:
    # escapeLiteralBackReferences takes positions from the original replacement: "$5 $6"
    # becomes "\$5\ $6", and $6 fails in Java as here.
    with pytest.raises(ValueError, match="No group 6"):
        PrincipalMapper.parse(r"RULE:^CN=(\w+)$/$5 $6/")


# --- Java regular expressions --------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "dn", "expected"),
    [
        (r"RULE:^(?i)cn=(\w+)(,.*|$)/$1/", "CN=Duke,O=x", "Duke"),
        (r"RULE:^CN=(\w+)(?i),o=(\w+)$|ou=(\w+)/$2$3/", "CN=a,O=b", "b"),
        (r"RULE:^CN=(?<u>\w)\k<u>.*$/$1/", "CN=aab", "a"),
        (r"RULE:^CN=\Qa.b\E$/ok/", "CN=a.b", "ok"),
        (r"RULE:^CN=(\w+)\z/$1/", "CN=duke", "duke"),
        (r"RULE:^CN=(\w+)\h(\w+)$/$1_$2/", "CN=a b", "a_b"),
    ],
)
def test_java_regex_syntax(rule: str, dn: str, expected: str) -> None:
    assert PrincipalMapper.parse(rule).name(dn) == expected


@pytest.mark.parametrize(
    ("rule", "dn"),
    [
        (r"RULE:^CN=(\w+)$/$1/", "CN=dukè"),  # Java's \w is ASCII
        (r"RULE:^CN=a\Qa.b\E$/$0/", "CN=aaxb"),  # \Q...\E is literal
        (r"RULE:^CN=(?i)DUKE$/$0/", "CN=DUKE "),
    ],
)
def test_java_regex_syntax_does_not_match(rule: str, dn: str) -> None:
    with pytest.raises(NoMatchingRule):
        PrincipalMapper.parse(rule).name(dn)


# --- properties ----------------------------------------------------------------------------


@given(st.text())
def test_default_returns_any_name_unchanged(dn: str) -> None:
    assert PrincipalMapper.parse("DEFAULT").name(dn) == dn


@given(st.text())
def test_a_whole_name_rule_returns_the_name_in_its_case(dn: str) -> None:
    # the empty match at the end adds "$1" of an empty match: nothing
    assert PrincipalMapper.parse("RULE:(?s)(.*)/$1/L").name(dn) == dn.lower()
    assert PrincipalMapper.parse("RULE:(?s)(.*)/$1/U").name(dn) == dn.upper()


_RULES = [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/",
    r"RULE:\/\\\(\)\n\t/\/\//",
    "RULE:, DEFAULT, /DEFAULT/U",
]


@given(
    st.lists(st.sampled_from(_RULES), max_size=5),
    st.sampled_from([",", ", ", " ,\n ", ",,"]),
    st.text(alphabet="CNOU=,\\ aeDk", max_size=20),
)
def test_a_config_string_is_its_rules_as_a_list(rules: list[str], separator: str, dn: str) -> None:
    from_string = PrincipalMapper.parse(separator.join(rules))
    from_list = PrincipalMapper.parse(rules)
    assert from_string == from_list
    assert _name_or_none(from_string, dn) == _name_or_none(from_list, dn)


def _name_or_none(mapper: PrincipalMapper, dn: str) -> str | None:
    try:
        return mapper.name(dn)
    except NoMatchingRule:
        return None
