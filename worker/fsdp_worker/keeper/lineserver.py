"""The keeper port's transport: one JSON line asked and one answered per connection, served by
one asyncio event loop in one thread (stdlib asyncio streams), not a thread per connection.

A gang of 1,024 nodes holds about as many long-polls open at once (coordinator.HOLD_SECONDS),
and every one is answered at once after each change: a thread each (socketserver, before) cost
a thread start per request and a thousand threads woken on one lock, and the coordinator fell
behind its keepers (bench/gang_scale.py). Here a held request is a future awaited on the loop.
The keeper process is otherwise threaded: `serve_forever` runs the loop on the thread that
calls it, and `wake` may be called from any thread. What a line means is the subclass's
(`answer_line`); the cap on connections, the line's size limit and the read timeout are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from typing import Any

from fsdp_worker.contract import gangwire

READ_SECONDS = 5.0
"""A connection's request line must arrive within this long (a slow or silent peer)."""
BACKLOG = 4096
"""Connections waiting to be accepted: every keeper asks again at once after a held answer
(a gang of 1,024 nodes: a thousand connections in the same millisecond, twice per restart).
One past it is dropped by the kernel and its sender's SYN retried 1 s, then 3 s later: that
wait, not the coordinator, was most of a restart at 1,024 nodes while asyncio's default of 100
stood here (start_server listens again with its own `backlog`). The kernel caps it at
net.core.somaxconn (4,096 by default since Linux 5.4)."""


class LineServer:
    """Listens on `port` (0: any) at once, as socketserver did: a port taken fails here."""

    def __init__(self, port: int, *, slots: int) -> None:
        self.socket = socket.create_server(("", port), backlog=BACKLOG)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self._slots = threading.BoundedSemaphore(slots)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._quit: asyncio.Event | None = None
        self._closing = False
        self._life = threading.Lock()  # serve_forever's start against shutdown's
        self._served = threading.Event()
        self._served.set()  # not serving: shutdown has nothing to wait for
        self._waiters: list[asyncio.Future[None]] = []

    async def answer_line(self, line: bytes, peer: str) -> dict[str, Any]:
        raise NotImplementedError

    def refuse_busy(self, peer: str) -> None:
        """A connection past the cap, closed unanswered (the subclass counts it)."""

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve on this thread, on an event loop of its own, until `shutdown`.
        (`poll_interval`: socketserver's, unused: shutdown wakes the loop itself.)"""
        with self._life:
            if self._closing:
                return
            self._served.clear()
        try:
            asyncio.run(self._serve())
        finally:
            self._served.set()

    async def _serve(self) -> None:
        with self._life:
            self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
            self._quit = asyncio.Event()
            if self._closing:
                return
        limit = gangwire.MAX_LINE + 1
        server = await asyncio.start_server(
            self._connection, sock=self.socket, limit=limit, backlog=BACKLOG
        )
        async with server:
            await self._quit.wait()

    def shutdown(self) -> None:
        """Stop serving and wait until `serve_forever` returned."""
        with self._life:
            self._closing = True
            loop, quit_ = self._loop, self._quit
        if loop is not None and quit_ is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(quit_.set)
        self._served.wait()

    def server_close(self) -> None:
        self.socket.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request: up to MAX_LINE + 1 bytes to a newline, its answer, closed."""
        peer = _peer(writer.get_extra_info("peername"))
        if not self._slots.acquire(blocking=False):
            self.refuse_busy(peer)
            with contextlib.suppress(OSError):
                writer.write_eof()  # the peer reads an end, as socketserver's shutdown_request
            writer.close()
            return
        try:
            line = await asyncio.wait_for(_read_line(reader), READ_SECONDS)
            answer = await self.answer_line(line, peer)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._slots.release()
            writer.close()

    async def held(self, timeout: float) -> None:
        """Wait until `wake` or `timeout` seconds, on the loop (a held long-poll)."""
        loop = asyncio.get_running_loop()
        news: asyncio.Future[None] = loop.create_future()
        self._waiters.append(news)
        timer = loop.call_later(max(0.0, timeout), _settle, news)
        try:
            await news
        finally:
            timer.cancel()

    def wake(self) -> None:
        """Answer every held request now (the state changed), from any thread."""
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake_all()
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for news in waiters:
            _settle(news)


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    """The request line; past the stream's limit (MAX_LINE + 1) without a newline, that many
    bytes, which the line's parser refuses as oversized (nothing more is read)."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial  # the peer closed its side after the line, without a newline
    except asyncio.LimitOverrunError:
        return await reader.read(gangwire.MAX_LINE + 1)


def _settle(news: asyncio.Future[None]) -> None:
    if not news.done():
        news.set_result(None)


def _peer(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
