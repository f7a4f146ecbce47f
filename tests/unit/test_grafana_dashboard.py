"""deploy/grafana/kafka-quota-proxy.json asks only for what the proxy exports: every metric name in
every query is a sample name of the proxy's own registry (built as the proxy builds it, with
fetch routing, storage throttling, shared budgets and capture on, so that every family is
there), every label a query filters, groups or names in a legend is one of that metric's labels
(or a label Prometheus adds to every target), and every exact label value it matches is one the
proxy writes. A metric renamed or removed in the proxy fails this test until the dashboard
follows. The dashboard itself: unique panel ids, panels that do not overlap, and its data source
a ``${DS_PROMETHEUS}`` input and variable."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_quota_proxy.config.loading import parse_config
from kafka_quota_proxy.proxy.features.capture.writer import Capture
from kafka_quota_proxy.proxy.metrics import make_registry
from kafka_quota_proxy.proxy.server import Proxy

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "kafka-quota-proxy.json"

# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})

FUNCTIONS = frozenset({
    # PromQL functions
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
    "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg",
    "delta", "deriv", "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction",
    "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum",
    "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
    "last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time", "min_over_time",
    "minute", "month", "pi", "predict_linear", "present_over_time", "quantile_over_time", "rad",
    "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label",
    "sort_by_label_desc", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time",
    "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year",
    # aggregation operators
    "avg", "bottomk", "count", "count_values", "group", "limit_ratio", "limitk", "max", "min",
    "quantile", "stddev", "stdvar", "sum", "topk",
    # Grafana's Prometheus variable queries
    "label_names", "label_values", "metrics", "query_result",
})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
                      "group_left", "group_right"})
GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
MATCHER = re.compile(r"""([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:\\.|[^"\\])*)\"""")
STRING = re.compile(r""""(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'""")
NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w:])")
IDENTIFIER = re.compile(r"[A-Za-z_:][\w:]*")
LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}")

ALL_FEATURES = """
listeners: {bootstrap: "127.0.0.1:9192", advertised_host: "h", broker_ports: "9193-9194"}
upstream: {bootstrap_servers: ["127.0.0.1:9092"]}
racks: {proxy_rack: a}
storage: {hard: {type: MinFreePercentage, level: 5}}
coordination: {enabled: true}
"""


def exported(tmp_path: Path) -> dict[str, frozenset[str]]:
    """Every sample name the proxy's registry exports, with its labels: the registry as
    ``Proxy`` wires it, capture's families added as ``Proxy.start`` does."""
    proxy = Proxy(parse_config(ALL_FEATURES))
    capture = Capture(tmp_path / "capture")
    try:
        proxy.stats.feature_families.append(capture.metric_families)
        families = list(make_registry(proxy.stats).collect())
    finally:
        capture.close()
    names: dict[str, set[str]] = {}
    for family in families:
        labels = set(getattr(family, "_labelnames", ()))
        # A labelled family without children has no samples: its sample names and their
        # labels by its type.
        name = family.name
        derived: dict[str, set[str]] = {
            "counter": {f"{name}_total": labels},
            "histogram": {f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels,
                          f"{name}_count": labels},
            "summary": {name: labels | {"quantile"}, f"{name}_sum": labels,
                        f"{name}_count": labels},
        }.get(family.type, {name: labels})
        for sample_name, sample_labels in derived.items():
            names.setdefault(sample_name, set()).update(sample_labels)
        for sample in family.samples:  # _total, _bucket, _sum, _count, _created as exported
            names.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in names.items()}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend format) of every panel target and every query variable."""
    found: list[tuple[str, str, str]] = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} target {target.get('refId')}"
            found.append((where, target["expr"], target.get("legendFormat", "")))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            found.append((f"variable {variable['name']}", text, ""))
            found.append((f"variable {variable['name']} definition", variable["definition"], ""))
    return found


class Analysis:
    """The metric names, label matchers, grouping labels and function calls of one query."""

    def __init__(self, expr: str) -> None:
        text = re.sub(r"\$\{?\w+\}?", " ", expr.replace("$__rate_interval", "5m"))
        self.matchers: list[tuple[str | None, str, str, str]] = []
        for selector in SELECTOR.finditer(text):
            for label, op, value in MATCHER.findall(selector.group(2)):
                self.matchers.append((selector.group(1), label, op, value))
            rest = STRING.sub("", MATCHER.sub("", selector.group(2))).strip(" ,")
            assert not rest, f"unparsed label matchers {rest!r} in {expr!r}"
        text = SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
        text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery selectors
        self.grouping: set[str] = set()
        for _, labels in GROUPING.findall(text):
            self.grouping.update(label.strip() for label in labels.split(",") if label.strip())
        text = GROUPING.sub(" ", text)
        self.label_values: list[tuple[str, str]] = [
            (metric, label) for metric, label in re.findall(
                r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*([A-Za-z_]\w*)\s*\)", text)]
        text = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*[A-Za-z_]\w*\s*\)",
                      r"label_values(\1)", text)
        text = NUMBER.sub(" ", STRING.sub(" ", text))
        self.metrics: set[str] = set()
        self.unknown: set[str] = set()
        for m in IDENTIFIER.finditer(text):
            word = m.group(0)
            called = text[m.end():].lstrip().startswith("(")
            if called:
                if word not in FUNCTIONS:
                    self.unknown.add(f"{word}()")
            elif word in KEYWORDS:
                continue
            else:
                self.metrics.add(word)


@pytest.fixture(scope="module")
def registry_names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, frozenset[str]]:
    return exported(tmp_path_factory.mktemp("metrics"))


def test_the_registry_view_has_the_suffixed_sample_names(
        registry_names: dict[str, frozenset[str]]) -> None:
    assert "kafka_proxy_requests_total" in registry_names  # a labelled counter, no children
    assert "kafka_proxy_requests" not in registry_names
    latency = "kafka_proxy_upstream_latency_seconds"
    assert {f"{latency}_bucket", f"{latency}_sum", f"{latency}_count"} <= set(registry_names)
    assert "le" in registry_names["kafka_proxy_upstream_latency_seconds_bucket"]
    assert registry_names["kafka_proxy_quota_entity_bytes_per_second"] == {
        "broker", "quota", "user", "client_id"}
    assert "kafka_proxy_storage_state" in registry_names  # a feature's family
    assert "kafka_proxy_capture_records_total" in registry_names


def test_every_query_uses_exported_metrics_and_their_labels(
        registry_names: dict[str, frozenset[str]]) -> None:
    sources = "\n".join(p.read_text() for package in ("proxy", "quota", "protocol")
                        for p in (ROOT / "kafka_quota_proxy" / package).rglob("*.py"))
    problems: list[str] = []
    used: set[str] = set()
    all_queries = queries(load())
    assert len(all_queries) > 40
    for where, expr, legend in all_queries:
        a = Analysis(expr)
        if a.unknown:
            problems.append(f"{where}: not PromQL functions: {sorted(a.unknown)}")
        missing = sorted(name for name in a.metrics if name not in registry_names)
        if missing:
            problems.append(f"{where}: not exported by the proxy: {missing}")
        known = [name for name in a.metrics if name in registry_names]
        used.update(known)
        available = set(TARGET_LABELS).union(*(registry_names[name] for name in known))
        for metric, label, op, value in a.matchers:
            own = (registry_names.get(metric, frozenset()) | TARGET_LABELS) if metric else available
            if label not in own:
                problems.append(f"{where}: {metric or 'the query'} has no label {label!r}")
            elif op == "=" and label not in TARGET_LABELS and f'"{value}"' not in sources:
                problems.append(f"{where}: {label}={value!r} is not a value the proxy writes")
        for label in sorted(a.grouping - available):
            problems.append(f"{where}: groups by {label!r}, a label none of {sorted(known)} has")
        for metric, label in a.label_values:
            if label not in registry_names.get(metric, frozenset()) | TARGET_LABELS:
                problems.append(f"{where}: label_values of {metric} by a label it lacks: {label}")
        for label in LEGEND_LABEL.findall(legend):
            if label not in available:
                problems.append(f"{where}: legend names {label!r}, a label the series lack")
    assert not problems, "\n".join(problems)
    assert all(name.startswith("kafka_proxy_") for name in used)


def test_the_analysis_catches_what_it_should() -> None:
    a = Analysis('sum by (api) (rate(kafka_proxy_requests_total{job=~"$job",api="Fetch"}'
                 '[$__rate_interval])) / on(instance) group_left max(up) > bool 0.5e3')
    assert a.metrics == {"kafka_proxy_requests_total", "up"}
    assert a.grouping == {"api", "instance"}
    assert ("kafka_proxy_requests_total", "api", "=", "Fetch") in a.matchers
    assert not a.unknown
    assert Analysis("kafka_proxy_requests_ms_total").metrics == {"kafka_proxy_requests_ms_total"}
    assert Analysis("frobnicate(kafka_proxy_open_fds)").unknown == {"frobnicate()"}
    v = Analysis('label_values(kafka_proxy_upstream_brokers{job=~"$job"}, instance)')
    assert v.label_values == [("kafka_proxy_upstream_brokers", "instance")]
    assert v.metrics == {"kafka_proxy_upstream_brokers"}


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    all_panels = panels(load())
    ids = [panel["id"] for panel in all_panels]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    placed: list[tuple[str, int, int, int, int]] = []
    for panel in all_panels:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for title, x, y, w, h in placed:
            overlap = (g["x"] < x + w and x < g["x"] + g["w"]
                       and g["y"] < y + h and y < g["y"] + g["h"])
            assert not overlap, f"{panel['title']!r} overlaps {title!r}"
        placed.append((panel["title"], g["x"], g["y"], g["w"], g["h"]))
        ref_ids = [t["refId"] for t in panel.get("targets", [])]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_the_data_source_is_an_input_and_a_variable() -> None:
    dashboard = load()
    assert {"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}.items() <= (
        dashboard["__inputs"][0].items())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    expected = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    for node in _walk(dashboard):
        if "datasource" in node and node is not variables["DS_PROMETHEUS"]:
            source = node["datasource"]
            if source.get("type") == "grafana":
                continue  # the built-in annotations
            assert source == expected, node.get("title") or node.get("name") or node
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"] == expected, panel["title"]
            assert panel["targets"], panel["title"]
