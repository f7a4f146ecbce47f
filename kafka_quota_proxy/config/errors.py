"""Configuration errors and their positions: every message reads
``FILE:LINE:COLUMN: field.path: what is wrong``."""

from __future__ import annotations

from typing import Any

import yaml


def did_you_mean(key: str, known: Any) -> str:
    """`` (did you mean 'x'?)`` for the known key closest to ``key``, or nothing."""
    import difflib

    close = difflib.get_close_matches(key, [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class ConfigError(Exception):
    """A configuration that cannot be used; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


# ---------------------------------------------------------------- YAML with positions


def positions(
    node: yaml.Node,
    path: tuple[Any, ...],
    out: dict[tuple[Any, ...], yaml.Mark],
    errors: list[tuple[int, int, str]],
    source: str,
) -> None:
    """Where each key and item is (``out``), and each duplicate key as (line, column,
    message) in ``errors``."""
    out.setdefault(path, node.start_mark)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                m = key_node.start_mark
                dotted = ".".join(str(p) for p in (*path, key))
                errors.append((m.line, m.column,
                               f"{source}:{m.line + 1}:{m.column + 1}: {dotted}: duplicate key"))
            seen.add(key)
            out[(*path, key)] = key_node.start_mark
            positions(value_node, (*path, key), out, errors, source)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            positions(item, (*path, i), out, errors, source)


def mark_for(loc: tuple[Any, ...], marks: dict[tuple[Any, ...], yaml.Mark]) -> yaml.Mark | None:
    loc = tuple(loc)
    while loc:
        if loc in marks:
            return marks[loc]
        loc = loc[:-1]
    return marks.get(())

