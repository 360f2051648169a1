"""Node rank 0's store port, free before its next generation starts.

Node rank 0's ranks host the gang's TCPStore on the rendezvous port: torchrun's agent, or the
warm launcher's rank 0 (warm.py). c10d binds it as `held` does: ``[::]`` (IPv4 too), with
SO_REUSEADDR, so a connection of the last generation in TIME_WAIT does not stop it; a listener
still open does. After a restart in place the keeper has reaped the last generation's launcher,
but a warm launch's rank 0 is its forked child, killed with it and reparented: it closes its
listener only at the end of its exit, after its memory is unmapped (measured here: 0.23 s for
3 GiB of memory; more with more), and the next store then fails with EADDRINUSE, costing a
whole restart in place. So node rank 0 waits, bounded, until the port can be bound. Apart from
the launchers (launchers.py) because it is the one part that binds sockets; no torch.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

WAIT_SECONDS = 10.0
"""How long node rank 0 waits for the last generation's store to let its port go; then it
launches anyway, and the store's own error says why."""
POLL_SECONDS = 0.05


def held(port: int) -> bool:
    """Whether a TCPStore could not bind `port` now: c10d (libuv and legacy backends alike)
    binds ``[::]`` with SO_REUSEADDR, falling back to ``0.0.0.0`` where IPv6 is off."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):  # noqa: S104
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 in this pod
        with contextlib.closing(sock):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                continue  # IPv6 disabled (EADDRNOTAVAIL): c10d tries IPv4 as well
            return False
    return False


def port_of(endpoint: str) -> int | None:
    """The port of torchrun's ``--rdzv-endpoint`` host:port (None: none given)."""
    _host, _, port = endpoint.rpartition(":")
    return int(port) if port.isdigit() else None


def wait_until_free(
    port: int,
    *,
    bound: float | None = None,
    poll: float = POLL_SECONDS,
    is_held: Callable[[int], bool] = held,
) -> bool:
    """Wait up to `bound` seconds (WAIT_SECONDS) until `port` can be bound; whether it can.
    One line logged when it had to wait, and one when it gave up."""
    bound = WAIT_SECONDS if bound is None else bound
    began = time.monotonic()
    waited = False
    while is_held(port):
        if time.monotonic() - began >= bound:
            log.warning(
                "the store port %d is still held after %.1fs: launching anyway", port, bound
            )
            return False
        waited = True
        time.sleep(poll)
    if waited:
        log.warning(
            "the store port %d was held by the last generation: waited %.2fs",
            port,
            time.monotonic() - began,
        )
    return True
