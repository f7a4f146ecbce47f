"""A short human summary of a configuration (``check-config``)."""

from __future__ import annotations

from config.schema import ProxyConfig


def summarize(config: ProxyConfig) -> str:
    lines = [
        f"bootstrap listener : {config.listeners.bootstrap}",
        f"advertised host    : {config.listeners.advertised_host}",
        f"broker ports       : {config.listeners.broker_ports} "
        f"({len(config.listeners.broker_ports)} brokers max)",
        f"upstream bootstrap : {', '.join(str(s) for s in config.upstream.bootstrap_servers)}",
        f"metrics            : {config.metrics.listen or 'off'}",
        f"max frame bytes    : {config.network.max_frame_bytes}",
        f"quota entities     : {len(config.quotas.entities)} "
        f"(window {config.quotas.window.samples} x {config.quotas.window.size_seconds} s)",
        "fetch routing      : "
        + (f"{config.racks.selector} (proxy rack {config.racks.proxy_rack or 'unset'}, "
           f"{len(config.racks.clients)} client rules)" if config.racks else "off"),
    ]
    return "\n".join(lines)
