"""A short human summary of a configuration (``check-config``)."""

from __future__ import annotations

from kafka_quota_proxy.config.schema import ProxyConfig


def summarize(config: ProxyConfig) -> str:
    lines = [
        f"workers            : {config.workers}",
        f"bootstrap listener : {config.listeners.bootstrap}",
        f"advertised host    : {config.listeners.advertised_host}",
        f"broker ports       : {config.listeners.broker_ports} "
        f"({len(config.listeners.broker_ports)} brokers max)",
        f"upstream bootstrap : {', '.join(str(s) for s in config.upstream.bootstrap_servers)}",
        f"metrics            : {config.metrics.listen or 'off'}",
        f"max frame bytes    : {config.network.max_frame_bytes}",
        f"quota entities     : {len(config.quotas.entities)} "
        f"(window {config.quotas.window.samples} x {config.quotas.window.size_seconds} s"
        f"{_pacing(config.quotas.pacing)})",
        "shadow quotas      : " + _shadow(config),
        "fetch routing      : "
        + (f"{config.racks.selector} (proxy rack {config.racks.proxy_rack or 'unset'}, "
           f"{len(config.racks.clients)} client rules)" if config.racks else "off"),
        "capture            : "
        + (f"{config.capture.dir} (rotate at {config.capture.rotate_mb:g} MB or "
           f"{config.capture.rotate_seconds:g} s)" if config.capture else "off"),
        "storage throttling : "
        + (f"topic {config.storage.topic}, hard limit {config.storage.hard.type} "
           f"{config.storage.hard.level:g}, when data is missing {config.storage.on_missing}"
           if config.storage else "off"),
        "shared budgets     : " + _coordination(config),
        "ACLs               : " + _acls(config),
    ]
    for name, kind in config.listeners.kinds():
        security = kind.security
        what: str = security.protocol
        if security.tls is not None:
            what += f", client certificates {security.tls.client_auth}"
        if security.uses_sasl:
            what += f", SASL {security.sasl.mode}"
        if security.proxy_protocol != "none":
            what += f", PROXY protocol {security.proxy_protocol}"
        label = "listeners" if name is None else f"listener {name}"
        extra = "" if name is None else f" (bootstrap {kind.bootstrap}, ports {kind.broker_ports})"
        lines.append(f"{label:<19}: {what}{extra}")
        lines.append(f"{'  broker sees':<19}: {broker_view(config, security)}")
    upstream = config.upstream
    lines.append("upstream security  : "
                 + ("TLS" if upstream.tls else "plaintext")
                 + (f", SASL {upstream.sasl.mechanism} as {upstream.sasl.username}"
                    if upstream.sasl else ""))
    return "\n".join(lines)


def _acls(config: ProxyConfig) -> str:
    acls = config.acls
    if acls is None:
        return "off (every client may do what the proxy's own principal may)"
    n = len(acls.all_bindings())
    return (f"on, {n} binding{'s' if n != 1 else ''} in the config, super users "
            f"{', '.join(acls.super_users) or 'none'}, "
            f"{'open' if acls.allow_everyone_if_no_acl_found else 'closed'} where no ACL is "
            f"found, dynamic ACLs in topic {acls.topic}")


def _coordination(config: ProxyConfig) -> str:
    c = config.coordination
    if c.enabled is False:
        return "off (each process enforces its own budgets)"
    how = (f"topic {c.topic}, report every {c.report_ms} ms, stale after {c.staleness_ms} ms"
           f", instance {c.instance or '<host name>'}")
    if c.enabled == "auto":
        return f"auto: on when workers > 1 ({how})"
    return f"on ({how})"


def proxy_principal(config: ProxyConfig) -> str:
    """Who the brokers take the proxy's own upstream connections for."""
    upstream = config.upstream
    if upstream.sasl is not None:
        return f"the proxy's SASL login {upstream.sasl.username!r}"
    if upstream.tls is not None and upstream.tls.cert_file is not None:
        return "the proxy's TLS certificate"
    return "ANONYMOUS (the proxy's unauthenticated connection)"


def broker_view(config: ProxyConfig, security: object) -> str:
    """What a broker sees of a client of a listener kind: its own principal (SASL inspected,
    the exchange passes through), or the proxy's for every client (then the brokers' ACLs and
    quotas cannot tell the clients apart: the proxy's quotas and its guard of its own topics
    are what hold them; ``docs/security.md``)."""
    uses_sasl = bool(getattr(security, "uses_sasl", False))
    sasl = getattr(security, "sasl", None)
    if uses_sasl and sasl is not None and getattr(sasl, "mode", None) == "inspect":
        return "each client's own SASL principal (the exchange goes to the broker)"
    return (f"every client as {proxy_principal(config)}: broker ACLs and quotas cannot tell "
            "clients apart")


def _pacing(pacing: str) -> str:
    return ", strict pacing" if pacing == "strict" else ""


def _shadow(config: ProxyConfig) -> str:
    shadow = config.quotas.shadow
    if shadow is None:
        return "off"
    shape = (f"{len(shadow.entities)} entities (window {shadow.window.samples} x "
             f"{shadow.window.size_seconds} s{_pacing(shadow.pacing)})")
    return shape if shadow.enabled else f"off (enabled: false; {shape})"
