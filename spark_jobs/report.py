"""The report of one run: Markdown with PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def plot_rates(rates: pd.DataFrame, limits: dict[str, float | None], path: Path) -> None:
    """Per-second rate of the top entities over time, with their quota."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for cid, group in rates.groupby("client_id"):
        g = group.sort_values("interval")
        t = g["interval"] - rates["interval"].min()
        line = ax.plot(t, g["rate"] / 1e6, label=str(cid), linewidth=1)[0]
        limit = limits.get(str(cid))
        if limit:
            ax.axhline(limit / 1e6, color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xlabel("seconds since the capture started")
    ax.set_ylabel("MB/s on one broker (dashed: quota)")
    ax.set_title("Rate vs quota, top entities")
    ax.legend(fontsize="small")
    _save(fig, path)


def plot_throttles(histogram: pd.DataFrame, path: Path) -> None:
    """Throttled requests by throttle time (``bucket_ms``, ``requests``)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    if histogram.empty:
        ax.text(0.5, 0.5, "no request was throttled", ha="center", va="center")
    else:
        width = float(histogram["bucket_ms"].diff().min()) if len(histogram) > 1 else 50.0
        ax.bar(histogram["bucket_ms"], histogram["requests"], width=width, align="edge")
        ax.set_yscale("log")
    ax.set_xlabel("throttle time (ms)")
    ax.set_ylabel("throttled requests")
    ax.set_title("Throttle distribution")
    _save(fig, path)


def plot_before_after(totals: pd.DataFrame, path: Path, label: str) -> None:
    """Time held back per entity: as recorded (the live config) vs the replayed config."""
    top = totals.sort_values(["recorded_throttle_ms", "throttle_ms"], ascending=False).head(12)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(top))
    ax.bar([i - 0.2 for i in x], top["recorded_throttle_ms"] / 1000, width=0.4,
           label="recorded (live config)")
    ax.bar([i + 0.2 for i in x], top["throttle_ms"] / 1000, width=0.4, label=label)
    ax.set_xticks(list(x), [str(c) for c in top["client_id"]], rotation=30, ha="right",
                  fontsize="small")
    ax.set_ylabel("time held back (s)")
    ax.set_title("Before / after")
    ax.legend(fontsize="small")
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def _table(df: pd.DataFrame, columns: list[str], n: int = 15) -> str:
    head = df[columns].head(n)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in head.itertuples(index=False):
        cells = [_cell(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(out: Path, facts: dict[str, Any], profile: pd.DataFrame,
                 totals: pd.DataFrame, plots: dict[str, str]) -> Path:
    lines = ["# Quota replay report", ""]
    for key, value in facts.items():
        lines.append(f"- **{key}**: {value}")
    talkers = profile.assign(total=profile["produce_bytes"] + profile["fetch_bytes"]).sort_values(
        "total", ascending=False)
    lines += ["", "## Top talkers", "",
              _table(talkers, ["user", "client_id", "requests", "produce_bytes", "fetch_bytes",
                               "produce_rate_p99", "fetch_rate_p99", "request_time_share"]),
              "", "## Replay per entity", "",
              _table(totals.sort_values("throttle_ms", ascending=False),
                     ["user", "client_id", "requests", "throttled_requests", "throttle_ms",
                      "bytes_delayed", "recorded_throttled_requests", "recorded_throttle_ms"]),
              ""]
    for title, name in plots.items():
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
