"""The report of one run: Markdown with PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from kafka_quota_proxy.spark_jobs.replay import MultiProcess
from kafka_quota_proxy.spark_jobs.tune import Recommendation


def plot_rates(series: pd.DataFrame, quotas: dict[str, list[QuotaLine]], path: Path,
               window_s: int = 11) -> None:
    """Per-second rate of the top budgets over time (``label``, ``second``, ``value``: bytes/s
    on the budget's busiest broker; a second without a row moved nothing, drawn as 0, so no
    line bridges an idle stretch), thin, with the rate over the quota window
    (``window_s``, Kafka's 11 x 1 s) bold; each budget's quotas in its colour as steps at
    each generation (``quotas``: label -> lines, dashed, then dotted)."""
    fig, ax = plt.subplots(figsize=(10, 4.8))
    if not series.empty:
        start, end = int(series["second"].min()), int(series["second"].max())
        seconds = np.arange(start, end + 1)
    for label, group in series.groupby("label", sort=False):
        rate = (group.groupby("second")["value"].sum().reindex(seconds, fill_value=0.0)
                / 1e6)
        x = seconds - start
        line = ax.plot(x, rate.to_numpy(), linewidth=0.6, alpha=0.35)[0]
        colour = line.get_color()
        windowed = rate.rolling(window_s, min_periods=1).mean()
        ax.plot(x, windowed.to_numpy(), color=colour, linewidth=1.6,
                label=f"{label} rate ({window_s} s window; thin: per second)")
        for q, style in zip(quotas.get(str(label), []), ("--", ":"), strict=False):
            xs, ys = q.steps(start, end)
            if xs:
                ax.step(xs, [y / 1e6 if y is not None else np.nan for y in ys], where="post",
                        color=colour, linestyle=style, linewidth=1.2,
                        label=f"{_budget_name(str(label))} quota ({q.which})")
    if series.empty:
        ax.text(0.5, 0.5, "no produce or fetch traffic", ha="center", va="center")
    ax.set_xlabel("seconds since the capture started")
    ax.set_ylabel("MB/s on one broker")
    ax.set_title("Rate vs quota, top budgets (busiest broker of each)")
    if not series.empty:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


@dataclass(frozen=True)
class QuotaLine:
    """A budget's quota under one config (``which``) over time: ``changes`` are (Unix s it
    took effect, limit or None for no quota), in time order; the first holds from the start."""

    which: str
    changes: list[tuple[float, float | None]]

    def steps(self, start: int, end: int) -> tuple[list[float], list[float | None]]:
        """Step points in seconds since ``start``, up to ``end`` (both Unix s)."""
        xs: list[float] = []
        ys: list[float | None] = []
        for i, (at, limit) in enumerate(self.changes):
            x = 0.0 if i == 0 else max(0.0, at - start)
            if x > end - start:
                break
            if xs and x <= xs[-1]:
                xs.pop()
                ys.pop()
            xs.append(x)
            ys.append(limit)
        if xs:
            xs.append(float(end - start))
            ys.append(ys[-1])
        return xs, ys


def _budget_name(label: str) -> str:
    """``users/bob produce`` -> ``users/bob``."""
    return label.rsplit(" ", 1)[0]


def plot_throttles(recorded: pd.DataFrame, replayed: pd.DataFrame, path: Path,
                   label: str) -> None:
    """Throttled requests by throttle time (``bucket_ms``, ``requests``): as recorded by the
    proxy, and as replayed under ``label``."""
    fig, ax = plt.subplots(figsize=(8, 4))
    series = [(f"recorded ({_plural(recorded)} throttled)", recorded),
              (f"replayed: {label} ({_plural(replayed)} throttled)", replayed)]
    if recorded.empty and replayed.empty:
        ax.text(0.5, 0.5, "no request was throttled, recorded or replayed", ha="center",
                va="center")
    else:
        top = max(float(h["bucket_ms"].max()) for _, h in series if not h.empty)
        edges = np.linspace(0.0, top + 100.0, 41)  # both series on the same bins
        for i, (name, h) in enumerate(series):
            counts, _ = np.histogram(h["bucket_ms"], bins=edges, weights=h["requests"])
            ax.stairs(counts, edges, label=name, color=f"C{i}", linewidth=1.5,
                      fill=i == 0, alpha=0.35 if i == 0 else 1.0)
        ax.set_yscale("log")
        ax.legend(fontsize="small")
    ax.set_xlabel("throttle time (ms)")
    ax.set_ylabel("throttled requests")
    ax.set_title("Throttle distribution: recorded vs replayed")
    _save(fig, path)


def _plural(histogram: pd.DataFrame) -> str:
    return f"{int(histogram['requests'].sum()):,}" if not histogram.empty else "0"


def plot_before_after(totals: pd.DataFrame, path: Path, label: str) -> None:
    """Throttled client-seconds per client: as recorded (the live config) vs the replayed
    config, with the totals in the legend."""
    top = totals.sort_values(["recorded_held_seconds", "held_seconds"],
                             ascending=False).head(12)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(top))
    before, after = int(totals["recorded_held_seconds"].sum()), int(totals["held_seconds"].sum())
    ax.bar([i - 0.2 for i in x], top["recorded_held_seconds"], width=0.4,
           label=f"recorded, live config (total {before:,})")
    ax.bar([i + 0.2 for i in x], top["held_seconds"], width=0.4,
           label=f"replayed, {label} (total {after:,})")
    ax.set_xticks(list(x), [str(c) for c in top["client_id"]], rotation=30, ha="right",
                  fontsize="small")
    ax.set_ylabel("throttled client-seconds")
    ax.set_title("Before / after: seconds in which each client was held back")
    ax.legend(fontsize="small")
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}"
    if isinstance(v, int | np.integer) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _table(df: pd.DataFrame, columns: list[str], n: int = 15) -> str:
    head = df[columns].head(n)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in head.itertuples(index=False):
        cells = [_cell(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


BEFORE_AFTER = {"recorded_held_seconds": "recorded: throttled client-s",
                "held_seconds": "replayed: throttled client-s",
                "recorded_throttled_requests": "recorded: throttled requests",
                "recorded_held_back_s": "recorded: held back (s)",
                "recorded_bytes_delayed": "recorded: bytes delayed",
                "throttled_requests": "replayed: throttled requests",
                "held_back_s": "replayed: held back (s)",
                "bytes_delayed": "replayed: bytes delayed"}


MULTI_PROCESS = {"broker": "broker", "quota_type": "quota type", "budget": "budget",
                 "quota": "quota", "processes": "processes", "requests": "requests",
                 "traffic_s": "traffic (s)", "rate": "recorded: rate",
                 "ratio": "recorded: ratio", "recorded_throttled": "recorded: throttled",
                 "recorded_held_back_s": "recorded: held back (s)",
                 "replayed_throttled": "single point: throttled",
                 "replayed_held_back_s": "single point: held back (s)",
                 "single_rate": "single point: rate", "single_ratio": "single point: ratio"}


def _budget_path(user: str, client: str) -> str:
    """A budget's tags as Kafka's configuration path names its entity."""
    if user and client:
        return f"users/{user}/clients/{client}"
    return f"users/{user}" if user else f"clients/{client}"


def _utc(ms: int) -> str:
    stamp = pd.Timestamp(int(ms), unit="ms", tz="UTC")
    return f"{stamp:%Y-%m-%d %H:%M:%S}.{int(ms) % 1000:03d}"


def multi_process_lines(multi: MultiProcess) -> list[str]:
    """The "Multi-process capture" section: the processes, then per budget with a quota the
    rate the processes let through together and what one enforcement point gives."""
    p = multi.processes
    procs = p.assign(instance=p["instance"].replace("", "(not recorded)"),
                     first=p["first_ms"].map(_utc), last=p["last_ms"].map(_utc),
                     seconds=(p["last_ms"] - p["first_ms"]) / 1000.0)
    b = multi.budgets
    budgets = b.assign(
        budget=[_budget_path(u, c) for u, c in zip(b["budget_user"], b["budget_client"],
                                                    strict=True)],
        traffic_s=b["traffic_ms"] / 1000.0, recorded_held_back_s=b["recorded_held_ms"] / 1000.0,
        replayed_held_back_s=b["replayed_held_ms"] / 1000.0).rename(columns=MULTI_PROCESS)
    return [
        "## Multi-process capture", "",
        f"Written by {len(p)} processes whose runs overlap in time. Each process enforced the "
        "quotas on its own (coordinated with the others or not) and recorded on its own quota "
        "clock; the reproduction above replays each one alone. Here the whole capture is "
        "also replayed through one quota engine per broker, a single enforcement point, "
        "under " + multi.config + ". The requests of every run are placed on one clock: "
        "`quota_ms` plus the run's offset, the median of `ts_ms - quota_ms` over its rows.",
        "", _table(procs, ["process", "instance", "run", "requests", "first", "last",
                           "seconds"], n=100), "",
        "Per broker and quota type, each budget with a quota (as the quota engine shares "
        "it: per user, client-id or both). *Traffic*: the gaps between the budget's "
        "consecutive requests on the broker, each counted up to the quota window (samples "
        "x window size: a longer pause is idle), times n / (n - 1) for its n requests (n "
        "requests d apart count n x d). *Rate*: what the budget recorded (bytes; request "
        "time in percent of one thread x s) over its traffic time; *ratio*: rate / quota. "
        "*Recorded*: the requests as the processes let them through, with the throttles "
        "they recorded. *Single point*: throttled requests and time held back as one engine "
        "gives them over the same requests; its rate and ratio count only the requests one "
        "engine would have let through had each connection waited out its throttles (a "
        "request arriving on a held connection is dropped: the client's demand over its "
        "quota is cut, not moved). One process gives ratios up to about 1 for a client "
        "held by its quota; N uncoordinated processes up to N.", "",
        _table(budgets, list(MULTI_PROCESS.values()), n=40), ""]


def write_report(out: Path, facts: dict[str, Any], profile: pd.DataFrame,
                 before_after: pd.DataFrame, plots: dict[str, str],
                 recommendation: Recommendation | None = None, label: str = "",
                 base_label: str = "", multi: MultiProcess | None = None) -> Path:
    """``before_after``: per (user, client-id), ``entities`` (the quota entities whose budgets
    it records into under the replayed config) and the ``BEFORE_AFTER`` columns. ``multi``:
    the "Multi-process capture" section, for a capture of processes that ran at the same
    time."""
    lines = ["# Quota replay report", ""]
    for key, value in facts.items():
        lines.append(f"- **{key}**: {value}")
    if recommendation is not None:
        r = recommendation
        lines += ["", "## Recommended quotas", "",
                  f"Base: {base_label}. Capture: {r.whole_minutes:g} whole minutes.", "",
                  f"**Rule.** {r.rule}", ""]
        if r.notes:
            lines += ["**Data.**", ""] + [f"- {n}" for n in r.notes] + [""]
        lines += ["```yaml", yaml.safe_dump({"quotas": r.section}, sort_keys=False).rstrip(),
                  "```", "", "Per entity (live: the base config; budgets: how many budgets of "
                  "the capture the entity governs; demand: the offered load the value is "
                  "from):", "",
                  _table(r.entities, list(r.entities.columns), n=200), ""]
        if r.why:
            lines += ["Why, per entity:", ""] + [f"- {w}" for w in r.why] + [""]
        if not r.totals.empty:
            lines += ["Totals per broker (the sum of each budget's limit over the budgets "
                      "seen; demand: the sum of their demands):", "",
                      _table(r.totals, list(r.totals.columns)), ""]
    if multi is not None:
        lines += ["", *multi_process_lines(multi)]
    ordered = before_after.assign(
        _key=before_after["recorded_held_back_s"] + before_after["held_back_s"]).sort_values(
        "_key", ascending=False)
    before = int(before_after["recorded_held_seconds"].sum())
    after = int(before_after["held_seconds"].sum())
    renamed = ordered.rename(columns={**BEFORE_AFTER,
                                      "entities": f"entities ({label or 'replayed'})"})
    lines += ["", f"## Before / after per entity (recorded vs replayed: {label})", "",
              "Throttled client-seconds (the seconds in which the client was held back by a "
              "throttle, counted per proxy process and broker), throttled requests, time "
              "held back (the largest of the three throttles) and bytes delayed (of the "
              "requests after which the client was held back), as the proxy recorded them "
              "and as the replay gives them. The replay sends the recorded requests at their "
              "recorded times: a client the live config held back would have sent more "
              "under a higher quota.", "",
              f"**Total throttled client-seconds**: recorded {before:,}, replayed "
              f"({label or 'replayed'}) {after:,}.", "",
              _table(renamed, ["user", "client_id", f"entities ({label or 'replayed'})",
                               *BEFORE_AFTER.values()], n=40), ""]
    talkers = profile.assign(total=profile["produce_bytes"] + profile["fetch_bytes"]).sort_values(
        "total", ascending=False)
    lines += ["## Top talkers", "",
              _table(talkers, ["user", "client_id", "requests", "produce_bytes", "fetch_bytes",
                               "produce_rate_p99", "fetch_rate_p99", "request_time_share"]),
              ""]
    for title, name in plots.items():
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
