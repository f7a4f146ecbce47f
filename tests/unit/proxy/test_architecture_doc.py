"""docs/architecture.md stays true to the code: every request-path filter (proxy/filters and
each feature's folder in proxy/features) is a row of its chain table, naming the filter's file
and every hook the filter defines; every feature the proxy registers is a row of its feature
table, naming its file and every lifecycle hook it defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import kafka_quota_proxy.proxy.features as features_package
import kafka_quota_proxy.proxy.filters as filters_package
from kafka_quota_proxy.proxy.feature import Feature
from kafka_quota_proxy.proxy.features import FEATURES
from kafka_quota_proxy.proxy.filters.base import Filter, FilterChain

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
HOOKS = [h for h in FilterChain.__slots__ if h != "filters"]
LIFECYCLE = [name for name, _ in inspect.getmembers(Feature, inspect.isfunction)
             if not name.startswith("_")]


def _classes(package: ModuleType, base: type) -> list[type]:
    found = []
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, base) and cls is not base
                  and cls.__module__ == module.__name__]
    return found


def _rows() -> dict[str, str]:
    return {line.split("`")[1]: line for line in DOC.read_text().splitlines()
            if line.startswith("| `")}


def _path(cls: type) -> str:
    module = importlib.import_module(cls.__module__)
    assert module.__file__ is not None
    # (the doc names files from the package's root)
    return str(Path(module.__file__).relative_to(DOC.parents[1] / "kafka_quota_proxy"))


def test_every_filter_and_its_hooks_are_in_the_chain_table() -> None:
    rows = _rows()
    filters = _classes(filters_package, Filter) + _classes(features_package, Filter)
    assert len(filters) >= 9
    for cls in filters:
        row = rows.get(cls.__name__)
        assert row is not None, f"{cls.__name__} is not in docs/architecture.md's chain table"
        assert f"`{_path(cls)}`" in row, (cls.__name__, _path(cls))
        defined = [h for h in HOOKS if getattr(cls, h) is not getattr(Filter, h)]
        missing = [h for h in defined if h not in row]
        assert not missing, f"{cls.__name__}'s row leaves out {missing}"


def test_every_feature_and_its_lifecycle_are_in_the_feature_table() -> None:
    rows = _rows()
    features = [make.__self__ for make in FEATURES]  # type: ignore[attr-defined]
    assert len(features) >= 9 and all(issubclass(f, Feature) for f in features)
    assert sorted(_classes(features_package, Feature), key=str) == sorted(features, key=str), \
        "a feature class that FEATURES does not register"
    for cls in features:
        row = rows.get(cls.__name__)
        assert row is not None, f"{cls.__name__} is not in docs/architecture.md's feature table"
        assert f"`{_path(cls)}`" in row, (cls.__name__, _path(cls))
        defined = [h for h in LIFECYCLE if getattr(cls, h) is not getattr(Feature, h)]
        missing = [h for h in defined if f"{h}" not in row]
        assert not missing, f"{cls.__name__}'s row leaves out {missing}"
