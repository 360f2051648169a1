"""What a warm spare's keeper does while it waits for a node: answer rank 0's readiness probe,
and have torch's files read once.

A spare carries rank 0's readiness probe (for when it becomes node rank 0); standing by for
hours it must be Ready, not counted by a platform's "pod not Ready" alert, so its keeper
answers the probe itself until its ranks' metrics server takes the port. Apart from the keeper
(gang.py) because it is an HTTP server and a page-cache warm-up, not the gang's protocol; it
never imports torch itself (the warm-up runs in a child process).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from fsdp_worker import contract

log = logging.getLogger(__name__)


class StandingBy(http.server.BaseHTTPRequestHandler):
    """contract.PROGRESS_PATH's answer while a spare stands by: 200, no ranks yet."""

    def do_GET(self) -> None:
        found = self.path.split("?", 1)[0] == contract.PROGRESS_PATH
        body = b"spare standing by: no ranks yet\n" if found else b"not found\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # a probe a few seconds is no news
        pass


@contextlib.contextmanager
def answering_probe() -> Iterator[None]:
    """Answer rank 0's readiness probe on the metrics port (StandingBy) for the block's length;
    the port is free again after it, for the ranks' metrics server."""
    port = metrics_port(os.environ.get(contract.ENV_METRICS_PORT), contract.DEFAULT_METRICS_PORT)
    server = answer_progress(port)
    try:
        yield
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def answer_progress(port: int) -> http.server.ThreadingHTTPServer | None:
    """Serve StandingBy on `port` from a daemon thread; None (logged) where it is taken,
    or where metrics are off (port 0, as for rank 0's server)."""
    if port <= 0:
        return None
    try:
        server = http.server.ThreadingHTTPServer(("", port), StandingBy)
    except OSError as exc:
        log.warning("spare: cannot answer the readiness probe on port %d: %s", port, exc)
        return None
    # Polled often: a takeover waits for the shutdown before its ranks start.
    serve = functools.partial(server.serve_forever, poll_interval=0.05)
    threading.Thread(target=serve, name="standby-progress", daemon=True).start()
    return server


def metrics_port(raw: str | None, default: int) -> int:
    """The port rank 0's metrics (and its readiness probe) use: `raw`, else `default`."""
    try:
        return int(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a port: %d", contract.ENV_METRICS_PORT, raw, default)
        return default


WARM_IMPORTS = "import torch, torch.distributed.checkpoint, torch.distributed.fsdp"


def warm_imports() -> None:
    """Import what a rank imports once, so that its files are in the page cache when the
    spare's torchrun starts (a cold torch import reads some hundred MB)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-c", WARM_IMPORTS],
            timeout=600,
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
