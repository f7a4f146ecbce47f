"""Configuration errors as the tests read them: every error line is
``FILE:LINE:COLUMN: field.path: message`` (``config.errors``)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import parse_config

# A minimal valid configuration the error tests append to or edit. Line numbers:
#   1 listeners:  2 bootstrap  3 advertised_host  4 broker_ports  5 upstream:  6 bootstrap_servers
BASE = """\
listeners:
  bootstrap: "127.0.0.1:9192"
  advertised_host: "127.0.0.1"
  broker_ports: "9193-9292"
upstream:
  bootstrap_servers: ["127.0.0.1:9092"]
"""

ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<path>[^:]+): (?P<msg>.+)$")


def errors_of(text: str, source: str) -> list[str]:
    """The error lines of a configuration that must not load."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, source)
    assert info.value.errors, "ConfigError without error lines"
    assert str(info.value) == "\n".join(info.value.errors)
    return info.value.errors


def parse_error(line: str, source: str) -> dict[str, Any]:
    """One error line in its parts (line and col as ints)."""
    m = ERROR_LINE.match(line)
    assert m, f"not FILE:LINE:COL: path: message: {line!r}"
    d: dict[str, Any] = m.groupdict()
    d["line"], d["col"] = int(d["line"]), int(d["col"])
    assert d["file"] == source
    return d


def single_error(text: str, source: str) -> dict[str, Any]:
    """The one expected error of a configuration, in its parts."""
    errors = errors_of(text, source)
    assert len(errors) == 1, errors
    return parse_error(errors[0], source)
