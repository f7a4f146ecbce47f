"""Reading configuration files: bounded YAML (size, nesting, aliases), validated against
``config.schema`` and ``config.checks``, every error positioned (``config.errors``).

The configuration is built once and frozen. Unknown keys, duplicate keys and wrong types are
errors; every error message reads ``FILE:LINE:COLUMN: field.path: what is wrong``.

What a configuration names outside itself (certificates, keys, credentials: files read at
start) is checked by ``checks``, a callable the caller passes in (config does no I/O of its
own; ``proxy.files.file_checks`` is the one ``run`` and ``check-config`` pass): its
(field path, message) pairs are reported like every other error, at the key naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from kafka_quota_proxy.config.checks import cross_checks, quota_checks
from kafka_quota_proxy.config.errors import ConfigError, did_you_mean, mark_for, positions
from kafka_quota_proxy.config.schema import AgentFile, ProxyConfig, QuotasConfig, QuotasFile

# Bounds on a configuration file, so that a broken or hostile one costs little to refuse: its
# size, how deeply its collections nest, and how many nodes it holds once every alias is
# expanded (an alias bomb of a few hundred bytes otherwise expands to gigabytes as it is
# validated). Each is far beyond any real configuration.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 64
MAX_CONFIG_NODES = 200_000


# Checks of a valid configuration beyond itself (``proxy.files.file_checks``): each problem as
# (field path, message), reported at the key of that path.
Checks = Callable[[ProxyConfig], Iterable[tuple[tuple[Any, ...], str]]]


class ConfigTooLarge(yaml.composer.ComposerError):
    """A file past one of the bounds above."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with ``MAX_CONFIG_DEPTH`` on nesting, checked as it composes
    (deep nesting would otherwise exhaust Python's stack)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise ConfigTooLarge(
                    None, None, f"collections nested deeper than {MAX_CONFIG_DEPTH} levels",
                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes ``root`` holds with every alias expanded (shared nodes counted each time
    they are referred to), without expanding anything: each node's size is computed once."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[id(node)] = 1
            continue
        children = ([n for pair in node.value for n in pair]
                    if isinstance(node, yaml.MappingNode) else list(node.value))
        if children_done:
            total = 1
            for child in children:
                total += sizes[id(child)]
                if total > MAX_CONFIG_NODES:
                    break
            sizes[id(node)] = total
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


_FLOW = re.compile(r"""[\[\]{}"'#\n]""")


def _flow_depth_exceeds(text: str, limit: int) -> int | None:
    """Where (an offset) brackets of flow collections (``[``, ``{``) nest deeper than
    ``limit``, skipping quoted strings and comments: a linear pre-check, so that deep nesting
    is refused before PyYAML's scanner spends its time on it (``_BoundedLoader`` checks the
    real nesting; this only finds it sooner). None when they do not."""
    depth = 0
    quote = ""
    comment = False
    for m in _FLOW.finditer(text):
        c = m.group()
        if comment:
            comment = c != "\n"
        elif quote:
            if c == quote:
                quote = ""
        elif c in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif c in "\"'":
            quote = c
        elif c == "#":
            comment = True
    return None


def _load_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for positions) and its data, within the bounds above."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigTooLarge(None, None, f"larger than {MAX_CONFIG_BYTES} bytes", None)
    deep = _flow_depth_exceeds(text, MAX_CONFIG_DEPTH)
    if deep is not None:
        line = text.count("\n", 0, deep)
        column = deep - (text.rfind("\n", 0, deep) + 1)
        raise ConfigTooLarge(None, None,
                             f"collections nested deeper than {MAX_CONFIG_DEPTH} levels",
                             yaml.Mark("<config>", deep, line, column, None, 0))
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        if _expanded_size(root) > MAX_CONFIG_NODES:
            raise ConfigTooLarge(
                None, None, f"more than {MAX_CONFIG_NODES} values once its aliases are "
                "expanded", root.start_mark)
        return root, loader.construct_document(root)
    finally:
        loader.dispose()


def parse_config(text: str, source: str = "<config>", checks: Checks | None = None
                 ) -> ProxyConfig:
    """Parse and validate configuration text (and, with ``checks``, what it names). Raises
    ``ConfigError`` with positioned messages."""
    return _parse(text, source, ProxyConfig, checks)


_M = TypeVar("_M", bound=BaseModel)


def _parse(text: str, source: str, model: type[_M], checks: Checks | None = None) -> _M:
    duplicates: list[tuple[int, int, str]] = []
    try:
        root, data = _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "refused" if isinstance(exc, ConfigTooLarge) else "YAML syntax error"
        raise ConfigError([f"{where}: {kind}: {problem}"]) from None
    marks: dict[tuple[Any, ...], yaml.Mark] = {}
    if root is not None:
        positions(root, (), marks, duplicates, source)
    if not isinstance(data, dict):
        raise ConfigError([text for *_, text in duplicates]
                          + [f"{source}:1:1: the configuration must be a YAML mapping"])

    # every problem, in line order when raised: duplicate keys with the others
    reported: list[tuple[int, int, int, str]] = [
        (line, col, i, text) for i, (line, col, text) in enumerate(duplicates)]

    def report(loc: tuple[Any, ...], msg: str) -> None:
        mark = mark_for(loc, marks)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        line, col = (mark.line, mark.column) if mark else (-1, -1)
        reported.append((line, col, len(reported), f"{where}: {dotted}: {msg}"))

    def in_line_order() -> list[str]:
        return [text for *_, text in sorted(reported)]

    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(
                p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))
            )
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key" + _suggestion(model, loc)
            elif err["type"] == "missing":
                msg = "required field is missing"
            report(loc, msg)
        raise ConfigError(in_line_order()) from None
    if isinstance(config, ProxyConfig):
        for loc, msg in cross_checks(config):
            report(loc, msg)
        if checks is not None:
            for loc, msg in checks(config):
                report(loc, msg)
    elif isinstance(config, QuotasFile):
        for loc, msg in quota_checks(config.quotas):
            report(loc, msg)
    if reported:
        raise ConfigError(in_line_order())
    return config


def _suggestion(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """" (did you mean 'x'?)" for an unknown key, from the fields of the model where it is
    (nothing where the path cannot be followed through the models)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return ""
        current = _model_of(field.annotation)
        if current is None:
            return ""
    fields = getattr(current, "model_fields", None)
    if not fields or not isinstance(loc[-1], str):
        return ""
    known = {name for name in fields} | {
        alias for f in fields.values() for alias in _aliases(f)}
    return did_you_mean(loc[-1], known)


def _aliases(field: Any) -> list[str]:
    choices = getattr(field.validation_alias, "choices", None)
    names = [c for c in choices or () if isinstance(c, str)]
    if isinstance(field.alias, str):
        names.append(field.alias)
    return names


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model in an annotation (``X | None``, ``list[X]``, ``dict[str, X]``)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def load_config(path: str | Path, checks: Checks | None = None) -> ProxyConfig:
    """``parse_config`` of a file."""
    return _load(path, ProxyConfig, checks)


def load_agent_config(path: str | Path) -> AgentFile:
    return _load(path, AgentFile)


def parse_quotas(text: str, source: str = "<config>") -> QuotasConfig:
    """The ``quotas`` section for the what-if tools. A file with nothing but ``quotas:`` is
    validated alone; a file with other sections is validated as a full proxy configuration
    (so its errors are still reported). Raises ``ConfigError`` with positioned messages."""
    try:
        data = _load_yaml(text)[1]
    except yaml.YAMLError:
        return _parse(text, source, ProxyConfig).quotas  # reports the positioned syntax error
    if data is None or data == {}:
        raise ConfigError([
            f"{source}: the file is empty: expected a quotas: section, alone or in a full "
            "proxy configuration"])
    if isinstance(data, dict) and set(data) == {"quotas"}:
        return _parse(text, source, QuotasFile).quotas
    return _parse(text, source, ProxyConfig).quotas


def load_quotas_config(path: str | Path) -> QuotasConfig:
    """``parse_quotas`` of a file: a quota-only file or a full proxy configuration."""
    p = Path(path)
    return parse_quotas(_read(p), str(p))


def _load(path: str | Path, model: type[_M], checks: Checks | None = None) -> _M:
    p = Path(path)
    return _parse(_read(p), str(p), model, checks)


def _read(p: Path) -> str:
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError([f"{p}: larger than {MAX_CONFIG_BYTES} bytes"])
        return raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{p}: cannot read: not UTF-8 text (byte {exc.start}: {exc.reason})"]
        ) from None

