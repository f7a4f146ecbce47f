"""Listeners whose connections go through steps before the proxied connection starts: a PROXY
protocol header (``listeners.security.proxy_protocol``), then a TLS handshake
(``listeners.security.tls``). The connection-creation rates (``proxy.features.connection_rates``)
apply around the header: the listener's before it, the client address's (the header's source) after
it, before the handshake: a throttled client costs no handshake.

The header is read from the socket exactly (byte counts asked of the sans-IO parser) before
the connection's transport exists, so nothing after it (a TLS ClientHello, a Kafka request) is
consumed; the connection then starts with the client address the header names. The TLS
handshake is awaited here too, so that a failed one is logged with its reason (a TLS
listener made by ``create_server(ssl=...)`` drops failed handshakes silently). Either step
failing, or not done within ``network.request_header_timeout_seconds``, closes that one
connection with a logged reason.

Every accepted socket takes its place in ``network.max_connections`` at once
(``proxy.admission``), before its header or handshake: sockets that never finish either count
like proxied connections until they are closed. A listener that takes PROXY headers reads them
only from its ``proxy_protocol_trusted_sources``: a connection from anywhere else is closed
before a byte of it is read. Once the client address is known (the header's source) and has
passed its connection rate, it is counted against ``max_connections_per_ip``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Callable

from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.proxy_header import ProxyHeader, ProxyHeaderParser
from kafka_quota_proxy.proxy.admission import UNTRUSTED_SOURCE, ConnectionSlots, TrustedSources
from kafka_quota_proxy.proxy.features.connection_rates import Admission, ConnectionRateGuard
from kafka_quota_proxy.proxy.logs import get_logger
from kafka_quota_proxy.quota.connection_limits import Slot

log = get_logger("kafka_quota_proxy.accept")


class SecuredServer:
    """Accepts on ``sock``; reads each connection's PROXY header (``accept``: v1, v2, any; or
    None), makes the TLS handshake (``tls``, or None), then ``make(address)``'s protocol takes
    the connection over (``address``: the header's source, else None). Closes like an
    ``asyncio.Server``."""

    def __init__(self, sock: socket.socket, accept: str | None, tls: ssl.SSLContext | None,
                 make: Callable[[tuple[str, int] | None, int], asyncio.BaseProtocol],
                 timeout: float, refused: Callable[[str], None], listener: str,
                 rates: ConnectionRateGuard | None = None, kind: str | None = None,
                 scope: int | Callable[[], int] = 0, slots: ConnectionSlots | None = None,
                 trusted: TrustedSources | None = None) -> None:
        """``make(address, scope)``: the connection's protocol; ``rates``: the
        connection-creation rates, for connections of listener kind ``kind`` and quota scope
        ``scope`` (the listener's, or what chooses each connection's when it is accepted: the
        bootstrap listener's, ``proxy.bootstrap``); ``slots``: ``max_connections`` and the
        per-address limits; ``trusted``: who may send the PROXY header (None: anyone, as when
        no header is read)."""
        self.sock = sock
        self.slots = slots
        self.trusted = trusted
        self.rates = rates
        self.kind = kind
        self.choose_scope: Callable[[], int] = scope if callable(scope) else (lambda: scope)
        self.accept = accept
        self.tls = tls
        self.make = make
        self.timeout = timeout
        self.refused = refused
        self.listener = listener
        self._pending: set[asyncio.Task[None]] = set()
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self.sock)
            except OSError as exc:  # EMFILE and the like: wait a little, as asyncio does
                log.warning("accept_failed", listener=self.listener, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            task = loop.create_task(self._start(conn, addr))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _start(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        slot = None
        if self.slots is not None:
            slot = self.slots.take(self.listener)
            if slot is None:  # past max_connections: refused at once
                _abort(conn)
                return
        outcome = None
        try:
            outcome = await self._steps(conn, addr, slot)
        finally:
            if slot is not None and self.slots is not None and outcome is None:
                self.slots.release(slot)  # closed before its connection opened

    async def _steps(self, conn: socket.socket, addr: tuple[str, int], slot: Slot | None
                     ) -> str | None:
        """The steps; "opened" (the connection holds the slot from now on), "held" (over its
        address's rate: the slot goes when it is closed), else None (closed)."""
        loop = asyncio.get_running_loop()
        source: tuple[str, int] | None = None
        reason = detail = ""
        rates = self.rates if self.rates is not None and self.rates.active else None
        if self.trusted is not None and not self.trusted.trusts(addr[0]):
            self.trusted.log_refused(self.listener, f"{addr[0]}:{addr[1]}")
            self.refused(UNTRUSTED_SOURCE)
            _abort(conn)
            return None
        scope = self.choose_scope()
        try:
            admission = None
            if rates is not None:  # the listener's rate: wait while it is over (unread)
                admission = Admission(self.listener, self.kind, scope)
                await rates.wait_turn(admission)
            deadline = loop.time() + self.timeout
            async with asyncio.timeout_at(deadline):
                if self.accept is not None:
                    header = await self._header(conn)
                    source = header.source
                    if source is not None:
                        addr = source
            if (rates is not None and admission is not None
                    and not rates.admitted(admission, addr[0], self._closer(conn, slot))):
                return "held"  # over its address's rate: unread, closed when it has passed
            if (slot is not None and self.slots is not None
                    and not self.slots.claim(slot, addr[0], self.listener)):
                _abort(conn)  # its address holds max_connections_per_ip already
                return None
            async with asyncio.timeout_at(deadline):
                await loop.connect_accepted_socket(
                    lambda: self._made(source, scope, slot), conn, ssl=self.tls,
                    ssl_handshake_timeout=self.timeout if self.tls is not None else None)
            return "opened"
        except asyncio.CancelledError:  # the listener closed (shutdown)
            conn.close()
            raise
        except ProtocolError as exc:
            reason, detail = exc.reason, str(exc)
        except TimeoutError:
            reason = "tls_handshake_failed" if self.tls is not None else "proxy_header_timeout"
            detail = f"not done within {self.timeout:g} s"
        except (ConnectionResetError, BrokenPipeError, EOFError) as exc:
            # gone before a byte of the exchange (a TCP health check): not worth a warning
            log.debug("connection_closed", listener=self.listener,
                      client=f"{addr[0]}:{addr[1]}", reason="client_closed",
                      detail=str(exc) or type(exc).__name__)
            self.refused("client_closed")
            conn.close()
            return None
        except (OSError, ssl.SSLError, ConnectionError) as exc:  # the handshake failed
            reason = "tls_handshake_failed" if self.tls is not None else "client_error"
            detail = str(exc) or type(exc).__name__
        log.warning("connection_closed", listener=self.listener,
                    client=f"{addr[0]}:{addr[1]}", reason=reason, detail=detail,
                    offender="client")
        self.refused(reason)
        conn.close()
        return None

    def _made(self, source: tuple[str, int] | None, scope: int, slot: Slot | None
              ) -> asyncio.BaseProtocol:
        """The connection's protocol, holding the connection's slot from now on."""
        protocol = self.make(source, scope)
        if slot is not None and self.slots is not None:
            self.slots.assign(slot, protocol)
        return protocol

    def _closer(self, conn: socket.socket, slot: Slot | None) -> Callable[[], None]:
        """What closes a connection held over its address's rate (its slot with it)."""
        if slot is None:
            return conn.close

        def close() -> None:
            try:
                conn.close()
            finally:
                if self.slots is not None:
                    self.slots.release(slot)

        return close

    async def _header(self, conn: socket.socket) -> ProxyHeader:
        loop = asyncio.get_running_loop()
        parser = ProxyHeaderParser(self.accept)  # type: ignore[arg-type]
        data = b""
        while (header := parser.feed(data)) is None:
            data = await loop.sock_recv(conn, parser.needed())
            if not data:
                raise ConnectionError("closed before its PROXY header ended")
        return header

    def close(self) -> None:
        self._task.cancel()
        for task in list(self._pending):
            task.cancel()
        with contextlib.suppress(OSError):
            self.sock.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _abort(conn: socket.socket) -> None:
    """Close at once with RST, as a refused connection is (nothing of it was read)."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
