"""Kafka's ``ssl.principal.mapping.rules``: a port of ``SslPrincipalMapper``.

A broker turns the distinguished name of a client certificate into a user principal with these
rules; the proxy must find the same name to apply the same quotas. The grammar, the splitting of
the config string, the matching and the replacement are Kafka's, step by step:

- the rules are ``DEFAULT`` (the name unchanged) or ``RULE:pattern/replacement/`` with an
  optional ``L`` or ``U`` after the last slash (lower or upper case the result, Java's
  ``Locale.ENGLISH`` mapping, which Python's ``str.lower``/``str.upper`` share); ``\\`` escapes
  a ``/`` in pattern and replacement; a config string holds several, separated by commas and
  optional white space; empty rules are ignored;
- the first rule whose pattern matches the whole name (Java's ``Matcher.matches()``, Python's
  ``fullmatch``) wins; its result is Java's ``String.replaceAll(pattern, replacement)`` on the
  name, so every match is replaced, an empty match at the end too (``RULE:.*/x/`` gives
  ``xx``, as in Kafka: anchor patterns with ``^...$``);
- ``$n`` refers to group *n* and ``${name}`` to a named group, ``\\x`` is a literal ``x``; a
  ``$n`` beyond the pattern's groups is first made literal (Kafka's
  ``escapeLiteralBackReferences``, its quirks included), and ``$12`` means group 12 only if the
  pattern has 12 groups, else group 1 followed by ``2``;
- no rule matching raises `NoMatchingRule` (Kafka throws and the connection fails).

Patterns are Java regular expressions, compiled with Python's ``re`` under ``re.ASCII`` (Java's
``\\w``, ``\\d``, ``\\s``, ``\\b`` and case-insensitivity are ASCII by default). Java syntax
that Python lacks or reads differently is translated: inline flags anywhere (``^(?i)cn=...``;
Java keeps them to the end of the group, Python takes them only at the very start), named
groups ``(?<name>...)`` and ``\\k<name>``, quoting ``\\Q...\\E``, ``\\z``, ``\\Z``, ``\\h``,
``\\H``, ``\\v``, ``\\V`` and ``\\R``. Java syntax with no equivalent is refused with a
`ValueError`: ``\\p{...}`` classes, a class inside a class, ``&&`` intersection, a quantifier on
an anchor (``^*``), and whatever else Python's ``re`` does not compile. Left as Python reads
them: ``.``, ``^`` and ``$`` know only ``\\n`` as a line terminator (Java also ``\\r``, U+0085,
U+2028, U+2029), and Python-only syntax Kafka would refuse is accepted. Checked against Kafka's
own ``SslPrincipalMapper`` on OpenJDK 17 with thousands of generated rules and names: the same
names, the same failures, but for the difference below.

One deliberate difference: a replacement that Java could never expand (a ``$`` not followed by
a group, a group that does not exist, a trailing ``\\``) is refused when the rules are parsed,
where Kafka accepts it and fails each connection whose name the rule matches.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_RULES", "NoMatchingRule", "PrincipalMapper"]

DEFAULT_RULES = "DEFAULT"
"""Kafka's ``DEFAULT_SSL_PRINCIPAL_MAPPING_RULES``: the distinguished name is the principal."""

# Java's ``\s``, ``.`` and ``$`` (not multiline): Kafka's own grammar below is a Java regex.
_SPACE = r"[ \t\n\x0b\f\r]"
_DOT = r"[^\n\r\u0085\u2028\u2029]"
_END = r"(?!(?<=\r)\n)(?=(?:\r\n|[\n\r\u0085\u2028\u2029])?\Z)"

# Kafka's RULE_PATTERN; groups: 1 DEFAULT, 2 pattern, 4 replacement, 6 case flag, 7 other text.
_RULE = (
    r"(DEFAULT)"
    rf"|RULE:((\\{_DOT}|[^\\/])*)/((\\{_DOT}|[^\\/])*)/([LU]?){_DOT}*?"
    rf"|({_DOT}*?)"
)
_RULE_SPLITTER = re.compile(rf"{_SPACE}*({_RULE}){_SPACE}*(,{_SPACE}*|{_END})")
_RULE_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$([0-9]+)")

_VERTICAL = r"\n\x0b\f\r\x85\u2028\u2029"
_HORIZONTAL = r" \t\xa0\u1680\u180e\u2000-\u200a\u202f\u205f\u3000"
_JAVA_ESCAPES = {
    "z": r"\Z",
    "Z": _END,
    "v": f"[{_VERTICAL}]",
    "V": f"[^{_VERTICAL}]",
    "h": f"[{_HORIZONTAL}]",
    "H": f"[^{_HORIZONTAL}]",
    "R": rf"(?>\r\n|[{_VERTICAL}])",
}
_INLINE_FLAGS = re.compile(r"\(\?([a-zA-Z]+(?:-[a-zA-Z]*)?|-[a-zA-Z]+)\)")
_JAVA_CLASS_ESCAPES = {"v": _VERTICAL, "h": _HORIZONTAL}
_ASCII_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_DIGITS = frozenset("0123456789")
_JAVA_TRIMMED = "".join(map(chr, range(0x21)))  # what Java's String.trim() removes


class NoMatchingRule(Exception):
    """No rule applies to a distinguished name: Kafka fails the authentication."""


@dataclass(frozen=True, slots=True)
class _Rule:
    """One parsed rule; ``text`` is how Kafka's ``Rule.toString`` writes it."""

    text: str
    pattern: re.Pattern[str] | None = None
    expansion: tuple[str | int, ...] = ()
    to_lower_case: bool = False
    to_upper_case: bool = False

    def apply(self, distinguished_name: str) -> str | None:
        if self.pattern is None:
            return distinguished_name
        if self.pattern.fullmatch(distinguished_name) is None:
            return None
        result = _replace_all(self.pattern, distinguished_name, self.expansion)
        if self.to_lower_case:
            return result.lower()
        if self.to_upper_case:
            return result.upper()
        return result


class PrincipalMapper:
    """Kafka's ``SslPrincipalMapper``: a distinguished name to a principal name."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Sequence[_Rule]) -> None:
        self._rules = tuple(rules)

    @classmethod
    def parse(cls, rules: str | Sequence[str] | None = None) -> PrincipalMapper:
        """Rules as Kafka's config string, or one rule per list item; None is ``DEFAULT``.

        An empty string (or list) holds no rule, so every name fails, as in Kafka. Raises
        `ValueError` naming the first malformed rule.
        """
        if rules is None:
            texts = _split_rules(DEFAULT_RULES)
        elif isinstance(rules, str):
            texts = _split_rules(rules)
        else:
            texts = [rule.strip(" \t\n\x0b\f\r") for rule in rules]
        parsed = (_parse_rule(text) for text in texts)
        return cls([rule for rule in parsed if rule is not None])

    @property
    def rules(self) -> tuple[str, ...]:
        """The rules as Kafka writes them (``RULE:pattern/replacement/L``, ``DEFAULT``)."""
        return tuple(rule.text for rule in self._rules)

    def name(self, distinguished_name: str) -> str:
        """The principal name of the first rule that applies; `NoMatchingRule` if none does."""
        for rule in self._rules:
            principal_name = rule.apply(distinguished_name)
            if principal_name is not None:
                return principal_name
        raise NoMatchingRule(
            f"No rules apply to {distinguished_name}, rules [{', '.join(self.rules)}]"
        )

    def __repr__(self) -> str:
        return f"PrincipalMapper(rules = [{', '.join(self.rules)}])"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrincipalMapper) and self.rules == other.rules

    def __hash__(self) -> int:
        return hash(self.rules)


def _split_rules(rules: str) -> list[str]:
    """Kafka's ``splitRules``: ``RULE_SPLITTER.find()`` over the trimmed string."""
    text = rules.strip(_JAVA_TRIMMED)
    found: list[str] = []
    position = 0
    while position <= len(text):
        match = _RULE_SPLITTER.search(text, position)
        if match is None:
            break
        found.append(match.group(1))
        # Java's Matcher.find() starts one further after an empty match.
        position = match.end() + 1 if match.end() == match.start() else match.end()
    return found


def _parse_rule(rule: str) -> _Rule | None:
    """Kafka's ``parseRules`` for one rule: None for an empty rule."""
    match = _RULE_PARSER.match(rule)  # Matcher.lookingAt(): the last alternative matches ""
    if match is None or match.end() != len(rule):
        end = 0 if match is None else match.end()
        raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[end:]}`")
    if match.group(1) is not None:
        return _Rule(DEFAULT_RULES)
    pattern_text, replacement, case = match.group(2), match.group(4), match.group(6)
    if pattern_text is None:
        return None
    text = f"RULE:{pattern_text}/{replacement}" + {"L": "/L", "U": "/U"}.get(case, "")
    pattern = _compile(rule, pattern_text)
    try:
        expansion = _expansion(
            _escape_literal_back_references(replacement, pattern.groups), pattern
        )
    except ValueError as e:
        raise ValueError(f"Invalid rule: `{rule}`, replacement `{replacement}`: {e}") from None
    return _Rule(text, pattern, expansion, case == "L", case == "U")


def _compile(rule: str, java_pattern: str) -> re.Pattern[str]:
    try:
        with warnings.catch_warnings():
            # Python warns about ``--``, ``||`` and ``~~`` in a set; Java reads them literally.
            warnings.simplefilter("ignore", FutureWarning)
            return re.compile(_python_regex(java_pattern), re.ASCII)
    except (re.error, ValueError) as e:
        raise ValueError(f"Invalid rule: `{rule}`, pattern `{java_pattern}`: {e}") from None


def _python_regex(java: str) -> str:
    """A Java regular expression in Python's ``re`` syntax (see the module docstring)."""
    out: list[str] = []
    # Per open group, the inline flags set in it so far: Java keeps them to the end of the group,
    # Python takes ``(?i)`` only at the very start, so they become ``(?i:...)`` groups.
    scopes: list[list[str]] = [[]]
    i, n = 0, len(java)
    in_class = False
    class_start = 0  # where a ``]`` is a literal, not the end of the class
    while i < n:
        c = java[i]
        if c == "\\" and i + 1 < n:
            escaped = java[i + 1]
            if escaped == "Q":
                end = java.find("\\E", i + 2)
                out.append(re.escape(java[i + 2 : n if end < 0 else end]))
                i = n if end < 0 else end + 2
                continue
            if escaped in "pP":
                raise ValueError(f"Java's \\{escaped}{{...}} classes are not supported")
            translated = (_JAVA_CLASS_ESCAPES if in_class else _JAVA_ESCAPES).get(escaped)
            close = java.find(">", i + 3)
            if translated is not None:
                out.append(translated)
                i += 2
            elif escaped == "k" and not in_class and java.startswith("<", i + 2) and close > 0:
                out.append(f"(?P={java[i + 3 : close]})")
                i = close + 1
            else:
                out.append(java[i : i + 2])
                i += 2
            continue
        flags = _INLINE_FLAGS.match(java, i)
        if in_class:
            if c == "[":
                raise ValueError("a class inside a class (Java's union) is not supported")
            if java.startswith("&&", i):
                raise ValueError("class intersection (&&) is not supported")
            in_class = not (c == "]" and i != class_start)
        elif c == "[":
            in_class = True
            if java.startswith("^", i + 1):
                out.append("[")
                c, i = "^", i + 1
            class_start = i + 1
        elif flags is not None:
            out.append(f"(?{flags.group(1)}:")
            scopes[-1].append(flags.group(1))
            i = flags.end()
            continue
        elif c == "(":
            scopes.append([])
            if java.startswith("(?<", i) and java[i + 3 : i + 4] not in ("=", "!"):
                out.append("(?P")
                c = "<"
                i += 2
        elif c == "|":
            opened = scopes[-1]
            c = ")" * len(opened) + "|" + "".join(f"(?{flag}:" for flag in opened)
        elif c == ")":
            if len(scopes) == 1:
                raise ValueError(f"unmatched closing ')' at position {i}")
            c = ")" * len(scopes.pop()) + ")"
        out.append(c)
        i += 1
    out.extend(")" * len(opened) for opened in reversed(scopes))
    return "".join(out)


def _escape_literal_back_references(unescaped: str, groups: int) -> str:
    """Kafka's ``escapeLiteralBackReferences`` (from NiFi): ``$n`` beyond the groups made literal.

    As in Kafka, positions come from the original string while backslashes go into the
    escaped one, so a second escape lands one character early.
    """
    if groups == 0:
        return unescaped
    value = unescaped
    for match in _BACK_REFERENCE.finditer(unescaped):
        number = match.group(1)
        if number.startswith("0"):
            continue
        index = int(number)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = match.start(1)
            value = value[: start - 1] + "\\" + value[start - 1 :]
    return value


def _expansion(replacement: str, pattern: re.Pattern[str]) -> tuple[str | int, ...]:
    """Java's ``Matcher.appendReplacement`` syntax: literal text and group numbers."""
    parts: list[str | int] = []
    literal: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        i += 1
        if c == "\\":
            if i == n:
                raise ValueError("character to be escaped is missing")
            literal.append(replacement[i])
            i += 1
            continue
        if c != "$":
            literal.append(c)
            continue
        if i == n:
            raise ValueError("Illegal group reference: group index is missing")
        if replacement[i] == "{":
            start = i = i + 1
            while i < n and replacement[i] in _ASCII_ALNUM:
                i += 1
            name = replacement[start:i]
            if not name:
                raise ValueError("named capturing group has 0 length name")
            if i == n or replacement[i] != "}":
                raise ValueError("named capturing group is missing trailing '}'")
            if name[0] in _DIGITS:
                raise ValueError(f"capturing group name {{{name}}} starts with digit character")
            if name not in pattern.groupindex:
                raise ValueError(f"No group with name {{{name}}}")
            group = pattern.groupindex[name]
            i += 1
        else:
            if replacement[i] not in _DIGITS:
                raise ValueError("Illegal group reference")
            group = int(replacement[i])
            i += 1
            # The largest group number that exists, digit by digit.
            while i < n and replacement[i] in _DIGITS:
                longer = group * 10 + int(replacement[i])
                if longer > pattern.groups:
                    break
                group = longer
                i += 1
            if group > pattern.groups:
                raise ValueError(f"No group {group}")
        if literal:
            parts.append("".join(literal))
            literal.clear()
        parts.append(group)
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _replace_all(pattern: re.Pattern[str], text: str, expansion: tuple[str | int, ...]) -> str:
    """Java's ``Matcher.replaceAll``: Java's rule for the next search after an empty match."""
    out: list[str] = []
    appended = position = 0
    while position <= len(text):
        match = pattern.search(text, position)
        if match is None:
            break
        out.append(text[appended : match.start()])
        out.extend(part if isinstance(part, str) else match.group(part) or "" for part in expansion)
        appended = match.end()
        position = match.end() + 1 if match.end() == match.start() else match.end()
    out.append(text[appended:])
    return "".join(out)
