"""The slice of the kubelet's HTTPS API that ``kubectl logs`` needs: /containerLogs.

The API server proxies ``kubectl logs`` to ``https://<node InternalIP>:<kubeletEndpoint>``;
each node's address lives on the agent's bridge, so one server per node address answers from
the container log files under the state dir. The serving certificate is self-signed (the API
server does not verify kubelet certificates unless told to). exec, attach and port-forward are
not offered. Read-only: this module never changes pods.
"""

from __future__ import annotations

import http.server
import logging
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
PORT = 10250
IsRunning = Callable[[tuple[str, str, str]], bool]
"""(namespace, pod, container) -> whether that container still runs (ends a follow)."""


def _certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
             "-subj", "/CN=localcluster-kubelet", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert, key


def log_file(pods_dir: Path, *, namespace: str, pod: str, container: str) -> Path | None:
    """The newest log of that container (pods re-created under one name keep their uid apart)."""
    found = sorted(pods_dir.glob(f"{namespace}_{pod}_*/{container}.log"),
                   key=lambda p: p.stat().st_mtime)  # fmt: skip
    return found[-1] if found else None


def _tail(data: bytes, *, lines: int | None, limit: int | None) -> bytes:
    if lines is not None:
        data = b"".join(data.splitlines(keepends=True)[-lines:]) if lines > 0 else b""
    return data[:limit] if limit is not None else data


class _Handler(http.server.BaseHTTPRequestHandler):
    pods_dir: Path
    is_running: IsRunning

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            self._reply(200, b"ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._reply(404, b"only /containerLogs is served by a process node")
            return
        _, namespace, pod, container = parts
        query = urllib.parse.parse_qs(url.query)
        path = log_file(self.pods_dir, namespace=namespace, pod=pod, container=container)
        if path is None:
            self._reply(404, f"no log for {namespace}/{pod}/{container}".encode())
            return
        lines = int(query["tailLines"][0]) if "tailLines" in query else None
        limit = int(query["limitBytes"][0]) if "limitBytes" in query else None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        with path.open("rb") as handle:
            self.wfile.write(_tail(handle.read(), lines=lines, limit=limit))
            self.wfile.flush()
            if query.get("follow", ["false"])[0] == "true":
                self._follow(handle, (namespace, pod, container))

    def _follow(self, handle: object, target: tuple[str, str, str]) -> None:
        assert hasattr(handle, "read")
        while True:
            chunk = handle.read()
            if chunk:
                self.wfile.write(chunk)
                self.wfile.flush()
            elif not self.is_running(target):
                return
            else:
                time.sleep(0.2)

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("kubelet api: " + format, *args)


class KubeletApi:
    """One HTTPS server per node address, all reading the same pods directory."""

    def __init__(self, *, addresses: list[str], state_dir: Path, is_running: IsRunning) -> None:
        cert, key = _certificate(state_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        attrs = {"pods_dir": state_dir / "pods", "is_running": staticmethod(is_running)}
        handler = type("Handler", (_Handler,), attrs)
        self.servers = []
        for address in addresses:
            server = http.server.ThreadingHTTPServer((address, PORT), handler)
            server.daemon_threads = True
            server.socket = context.wrap_socket(server.socket, server_side=True)
            self.servers.append(server)
            threading.Thread(target=server.serve_forever, name="kubelet-api", daemon=True).start()

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
