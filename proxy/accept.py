"""Listeners whose connections go through steps before the proxied connection starts: a PROXY
protocol header (``listeners.security.proxy_protocol``), then a TLS handshake
(``listeners.security.tls``). The connection-creation rates (``proxy.connection_rate``) apply
around the header: the listener's before it, the client address's (the header's source) after
it, before the handshake: a throttled client costs no handshake.

The header is read from the socket exactly (byte counts asked of the sans-IO parser) before
the connection's transport exists, so nothing after it (a TLS ClientHello, a Kafka request) is
consumed; the connection then starts with the client address the header names. The TLS
handshake is awaited here too, so that a failed one is logged with its reason (a TLS
listener made by ``create_server(ssl=...)`` drops failed handshakes silently). Either step
failing, or not done within ``network.request_header_timeout_seconds``, closes that one
connection with a logged reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

from protocol.errors import ProtocolError
from protocol.proxy_header import ProxyHeader, ProxyHeaderParser
from proxy.connection_rate import Admission, ConnectionRateGuard
from proxy.logs import get_logger

log = get_logger("kafka_quota_proxy.accept")


class SecuredServer:
    """Accepts on ``sock``; reads each connection's PROXY header (``accept``: v1, v2, any; or
    None), makes the TLS handshake (``tls``, or None), then ``make(address)``'s protocol takes
    the connection over (``address``: the header's source, else None). Closes like an
    ``asyncio.Server``."""

    def __init__(self, sock: socket.socket, accept: str | None, tls: ssl.SSLContext | None,
                 make: Callable[[tuple[str, int] | None], asyncio.Protocol], timeout: float,
                 refused: Callable[[str], None], listener: str,
                 rates: ConnectionRateGuard | None = None, kind: str | None = None,
                 scope: int = 0) -> None:
        """``rates``: the connection-creation rates, for connections of listener kind ``kind``
        and quota scope ``scope``."""
        self.sock = sock
        self.rates = rates
        self.kind = kind
        self.scope = scope
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
        loop = asyncio.get_running_loop()
        source: tuple[str, int] | None = None
        reason = detail = ""
        rates = self.rates if self.rates is not None and self.rates.active else None
        try:
            admission = None
            if rates is not None:  # the listener's rate: wait while it is over (unread)
                admission = Admission(self.listener, self.kind, self.scope)
                await rates.wait_turn(admission)
            deadline = loop.time() + self.timeout
            async with asyncio.timeout_at(deadline):
                if self.accept is not None:
                    header = await self._header(conn)
                    source = header.source
                    if source is not None:
                        addr = source
            if (rates is not None and admission is not None
                    and not rates.admitted(admission, addr[0], conn.close)):
                return  # over its address's rate: held unread, closed when it has passed
            async with asyncio.timeout_at(deadline):
                await loop.connect_accepted_socket(
                    lambda: self.make(source), conn, ssl=self.tls,
                    ssl_handshake_timeout=self.timeout if self.tls is not None else None)
            return
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
            return
        except (OSError, ssl.SSLError, ConnectionError) as exc:  # the handshake failed
            reason = "tls_handshake_failed" if self.tls is not None else "client_error"
            detail = str(exc) or type(exc).__name__
        log.warning("connection_closed", listener=self.listener,
                    client=f"{addr[0]}:{addr[1]}", reason=reason, detail=detail,
                    offender="client")
        self.refused(reason)
        conn.close()

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
