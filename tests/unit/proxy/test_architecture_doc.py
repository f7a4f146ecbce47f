"""docs/architecture.md stays true to the code: every request-path filter in proxy/filters is
a row of its chain table, naming the filter's file and every hook the filter defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import proxy.filters
from proxy.filters.base import Filter, FilterChain

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
HOOKS = [h for h in FilterChain.__slots__ if h != "filters"]


def _filters() -> list[type[Filter]]:
    found = []
    for info in pkgutil.iter_modules(proxy.filters.__path__):
        module = importlib.import_module(f"proxy.filters.{info.name}")
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, Filter) and cls is not Filter
                  and cls.__module__ == module.__name__]
    return found


def test_every_filter_and_its_hooks_are_in_the_chain_table() -> None:
    rows = {line.split("`")[1]: line for line in DOC.read_text().splitlines()
            if line.startswith("| `")}
    filters = _filters()
    assert len(filters) >= 9
    for cls in filters:
        row = rows.get(cls.__name__)
        assert row is not None, f"{cls.__name__} is not in docs/architecture.md's chain table"
        path = cls.__module__.replace(".", "/") + ".py"
        assert f"`{path}`" in row, (cls.__name__, path)
        defined = [h for h in HOOKS if getattr(cls, h) is not getattr(Filter, h)]
        missing = [h for h in defined if h not in row]
        assert not missing, f"{cls.__name__}'s row leaves out {missing}"
