"""Node rank 0's keeper starts a generation only once the last generation's store has let
the rendezvous port go (keeper/storeport.py), with a real listener holding it."""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from fsdp_worker.keeper import launchers, storeport


def _listener(port: int = 0) -> socket.socket:
    """A listener as a TCPStore's: ``[::]`` with SO_REUSEADDR."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    sock.listen()
    return sock


@pytest.fixture
def store() -> Iterator[socket.socket]:
    """The last generation's store, still listening on the rendezvous port."""
    sock = _listener()
    yield sock
    sock.close()


def _start(port: int, *, node: int) -> float:
    """Start a generation whose argv names the port as torchrun's; seconds until started."""
    argv = [sys.executable, "-c", "pass", f"--rdzv-endpoint=127.0.0.1:{port}"]
    began = time.monotonic()
    proc = launchers.Launchers(argv, token="t").start(argv, generation=1, delta={}, node=node)
    started = time.monotonic() - began
    assert proc.wait(timeout=30) == 0
    return started


def test_node_zero_waits_for_the_last_store_to_let_the_port_go(
    store: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    port = store.getsockname()[1]
    assert storeport.held(port)
    threading.Timer(0.5, store.close).start()
    with caplog.at_level(logging.WARNING, logger=storeport.__name__):
        started = _start(port, node=0)
    assert 0.45 <= started < 5, started
    assert not storeport.held(port)
    assert len(caplog.records) == 1
    assert f"the store port {port} was held by the last generation" in caplog.records[0].message


def test_node_zero_launches_anyway_at_the_bound(
    store: socket.socket, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    port = store.getsockname()[1]
    monkeypatch.setattr(storeport, "WAIT_SECONDS", 0.6)
    with caplog.at_level(logging.WARNING, logger=storeport.__name__):
        started = _start(port, node=0)
    assert 0.6 <= started < 5, started
    assert storeport.held(port), "nothing let it go"
    assert len(caplog.records) == 1
    assert "still held after 0.6s: launching anyway" in caplog.records[0].message


def test_other_nodes_host_no_store_and_do_not_wait(store: socket.socket) -> None:
    assert _start(store.getsockname()[1], node=1) < 0.4


def test_a_connection_in_time_wait_does_not_hold_the_port() -> None:
    """c10d binds with SO_REUSEADDR: only a listener stops it, as `held` says."""
    server = _listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
    time.sleep(0.1)
    client.close()
    server.close()
    assert not storeport.held(port)
