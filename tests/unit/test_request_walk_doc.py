"""docs/request-walk.md stays true to the code: every file its walks name exists, every function
named (``Class.method`` or ``function``) is defined in that file, and the counts under each walk
are its table's (stops: rows; returns: rows in a file the walk already left, not the file of the
row before)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "request-walk.md"
PACKAGE = "kafka_quota_proxy"
ROOT = REPO / PACKAGE  # (the doc names files from the package's root, as every doc does)
_ROW = re.compile(r"^\| (\d+) \| `([^`]+)` \| `([^`]+)` \| (.+) \|$")
_COUNTS = re.compile(r"^Stops: (\d+)\. Returns to a file already left: (\d+)\.$")


class Row(NamedTuple):
    step: int
    file: str
    function: str


class Walk(NamedTuple):
    title: str
    rows: list[Row]
    counts: list[tuple[int, int]]  # the "Stops: N. Returns ...: M." lines of its section


def _walks(text: str) -> list[Walk]:
    """The sections of the doc that hold a table of stops."""
    walks: list[Walk] = []
    title = ""
    rows: list[Row] = []
    counts: list[tuple[int, int]] = []
    for line in [*text.splitlines(), "## (end)"]:
        if line.startswith("## "):
            if rows:
                walks.append(Walk(title, rows, counts))
            title, rows, counts = line[3:], [], []
        elif line.startswith("| ") and line[2:3].isdigit():
            match = _ROW.match(line)
            assert match is not None, f"not a row of | n | `file` | `function` | ...: {line}"
            rows.append(Row(int(match[1]), match[2], match[3]))
        elif (found := _COUNTS.match(line)) is not None:
            counts.append((int(found[1]), int(found[2])))
    return walks


WALKS = _walks(DOC.read_text())
ROWS = [(walk.title, row) for walk in WALKS for row in walk.rows]


def counted(rows: list[Row]) -> tuple[int, int]:
    """(stops, returns to a file already left)."""
    seen: set[str] = set()
    returns = 0
    previous = None
    for row in rows:
        if row.file != previous and row.file in seen:
            returns += 1
        seen.add(row.file)
        previous = row.file
    return len(rows), returns


def _module(path: str) -> ModuleType:
    """The module of a file named by its path from the package's root."""
    parts = [PACKAGE, *Path(path).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    module = importlib.import_module(".".join(parts))
    assert module.__file__ is not None
    assert Path(module.__file__).resolve() == (ROOT / path).resolve(), (path, module.__file__)
    return module


def defined(path: str, dotted: str) -> bool:
    """Whether ``dotted`` (``function``, ``Class`` or ``Class.method``) is defined in the file:
    the first name in the module's own namespace and made there, each further name in the
    namespace of the class before it (not inherited)."""
    module = _module(path)
    first, *rest = dotted.split(".")
    owner = vars(module).get(first)
    if owner is None or getattr(owner, "__module__", None) != module.__name__:
        return False
    for name in rest:
        if not isinstance(owner, type) or name not in vars(owner):
            return False
        owner = vars(owner)[name]
    return True


def test_the_doc_has_both_walks_each_with_its_counts() -> None:
    assert len(WALKS) == 2, [w.title for w in WALKS]
    for walk in WALKS:
        assert len(walk.counts) == 1, f"{walk.title}: one 'Stops: N. Returns ...: M.' line"


def test_steps_are_numbered_in_order() -> None:
    for walk in WALKS:
        assert [row.step for row in walk.rows] == list(range(1, len(walk.rows) + 1)), walk.title


@pytest.mark.parametrize(("walk", "row"), ROWS, ids=[f"{t[:6]}-{r.step}" for t, r in ROWS])
def test_every_file_and_function_named_exists(walk: str, row: Row) -> None:
    assert (ROOT / row.file).is_file(), f"{walk}, step {row.step}: no file {row.file}"
    assert defined(row.file, row.function), (
        f"{walk}, step {row.step}: {row.function} is not defined in {row.file}")


def test_the_counts_are_the_tables() -> None:
    for walk in WALKS:
        assert walk.counts == [counted(walk.rows)], (
            f"{walk.title}: the table has {counted(walk.rows)} (stops, returns); "
            f"the doc says {walk.counts}")


def test_the_checks_catch_a_name_that_is_not_there() -> None:
    """(What the checks above rely on: a missing, inherited or imported name is not defined.)"""
    assert defined("proxy/connection.py", "ProxiedConnection.data_received")
    assert not defined("proxy/connection.py", "ProxiedConnection.no_such_method")
    assert not defined("proxy/connection.py", "no_such_function")
    assert not defined("proxy/connection.py", "TlsProxiedConnection.data_received")  # (inherited)
    assert not defined("proxy/connection.py", "InFlight")  # (imported)
    assert counted([Row(1, "a", "f"), Row(2, "b", "f"), Row(3, "b", "g"), Row(4, "a", "f")]) \
        == (4, 1)
