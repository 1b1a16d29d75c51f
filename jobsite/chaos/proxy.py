"""A small TCP proxy between the workers and the chaos cluster: "connection loss" on demand.

`cut(seconds)` resets every connection going through it (both ends: the worker sees the server vanish, the
server sees the client vanish and rolls back its transaction) and, for `seconds`, resets every new connection
as soon as it is accepted, so reconnect attempts fail like they do against a host that dropped off the network
and came back. A database restart needs nothing from the proxy: the server closes its side and the proxy passes
that on.

asyncio on one background thread: a few dozen connections, each a pair of pumps.
"""

import asyncio
import contextlib
import threading
from dataclasses import dataclass

CHUNK = 1 << 16


@dataclass
class ProxyStats:
    accepted: int = 0
    refused: int = 0  # reset at once during a cut
    cut: int = 0  # live connections reset by a cut
    upstream_failed: int = 0  # the server did not answer (restarting)


class Proxy:
    """`upstream_host` is a host name or address, or a directory (PostgreSQL's unix socket `.s.PGSQL.<port>` in
    it): the proxy then puts a server that only listens on a socket on a TCP port too (the tests use that)."""

    def __init__(self, upstream_host: str, upstream_port: int, listen_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listen_host = listen_host
        self.port = 0
        self.stats = ProxyStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._live: set[tuple[asyncio.Transport, asyncio.Transport]] = set()
        self._refuse_until = 0.0

    # -- control (any thread) -------------------------------------------------------------------------------

    def start(self) -> int:
        """Start listening on a free port; returns it."""
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def cut(self, seconds: float) -> int:
        """Reset every live connection and refuse new ones for `seconds`. Returns how many were cut."""
        return asyncio.run_coroutine_threadsafe(self._cut(seconds), self._loop).result(10)

    def refusing(self) -> bool:
        return self._loop.time() < self._refuse_until

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the loop -------------------------------------------------------------------------------------------

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, self.listen_host, 0, reuse_address=True)

    async def _cut(self, seconds: float) -> int:
        self._refuse_until = self._loop.time() + seconds
        live, self._live = self._live, set()
        for pair in live:
            for transport in pair:
                transport.abort()
        self.stats.cut += len(live)
        return len(live)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut(0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing():
            self.stats.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await self._open_upstream()
        except OSError:
            self.stats.upstream_failed += 1
            writer.transport.abort()
            return
        self.stats.accepted += 1
        pair = (writer.transport, up_writer.transport)
        self._live.add(pair)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._live.discard(pair)
            for task in pumps:
                task.cancel()
            for transport in pair:
                transport.close()  # flushes what is buffered (a cut has aborted them already)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self.upstream
        if host.startswith("/"):
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
