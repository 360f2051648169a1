"""A TCP relay on loopback whose traffic can be held, as a cut link holds it.

The operator under test reaches the API server only through it. `cut()` stops relaying in both
directions while every connection stays open (the peer's kernel keeps what it sent, as it would
keep retransmitting into a dead link); `heal()` lets it flow again, late. Nothing is dropped or
reordered, so a write that was stuck in the cut is delivered when the link heals, unless the
sender gave up on it and reset the connection: that is the case the operator must be safe in.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._open = threading.Event()
        self._open.set()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
        with self._lock:
            socks, self._socks = [self._server, *self._socks], []
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._open.wait()  # a cut link accepts nothing new either
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._open.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
