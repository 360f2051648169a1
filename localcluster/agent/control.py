"""The agent's fault endpoint: JSON over HTTP on 127.0.0.1, its port written to the state dir.

``POST /<verb>`` with a JSON object of arguments; the answer is ``{"result": ...}`` or, with
status 400, ``{"error": "..."}``. ``localcluster.faults`` is the client. This module maps verbs
to agent operations and does nothing else.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localcluster.agent import kube, runtime

JSON = dict[str, Any]
ENDPOINT_FILE = "agent.json"


class Verbs:
    """The fault verbs; ``cut-link`` on the wire is :meth:`cut_link` here."""

    def __init__(self, agent: runtime.Agent) -> None:
        self.agent = agent

    def crash(
        self, *, namespace: str, pod: str, container: str | None = None, exit_code: int = 1,
        message: str = "",
    ) -> None:  # fmt: skip
        self.agent.runner(namespace, pod).crash(container, exit_code=int(exit_code),
                                                message=message)  # fmt: skip

    def oom(self, *, namespace: str, pod: str, container: str | None = None) -> None:
        self.agent.runner(namespace, pod).oom(container)

    def kill_rank(self, *, namespace: str, pod: str, rank: int, signal: int = 9) -> list[int]:
        return self.agent.runner(namespace, pod).kill_rank(int(rank), sig=int(signal))

    def freeze(self, *, namespace: str, pod: str) -> None:
        self.agent.runner(namespace, pod).freeze()

    def thaw(self, *, namespace: str, pod: str) -> None:
        self.agent.runner(namespace, pod).thaw()

    def cut_link(self, *, namespace: str, pod: str) -> None:
        self.agent.runner(namespace, pod).set_link(up=False)

    def restore_link(self, *, namespace: str, pod: str) -> None:
        self.agent.runner(namespace, pod).set_link(up=True)

    def pids(self, *, namespace: str, pod: str) -> list[int]:
        return self.agent.runner(namespace, pod).pids()

    def netns(self, *, namespace: str, pod: str) -> str | None:
        net = self.agent.runner(namespace, pod).net
        return net.netns if net else None

    def lose_node(self, *, node: str) -> None:
        self.agent.lose_node(node)

    def restore_node(self, *, node: str) -> None:
        self.agent.restore_node(node)

    def evict(self, *, namespace: str, pod: str) -> JSON:
        """Through the Eviction API (policy/v1), so PodDisruptionBudgets apply."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": namespace}}  # fmt: skip
        return self.agent.ctx.kube.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body=body
        )

    def status(self) -> JSON:
        return {"nodes": self.agent.nodes.names, "lost": sorted(self.agent.nodes.lost),
                "instance": self.agent.ctx.network.instance}  # fmt: skip

    def lookup(self, verb: str) -> Callable[..., Any]:
        method = getattr(self, verb.replace("-", "_"), None)
        if verb.startswith("_") or verb == "lookup" or not callable(method):
            known = sorted(n.replace("_", "-") for n in dir(self) if not n.startswith("_"))
            raise LookupError(f"unknown fault verb {verb!r}; known: {known}")
        return method  # type: ignore[no-any-return]


class _Handler(http.server.BaseHTTPRequestHandler):
    verbs: Verbs

    def do_POST(self) -> None:
        verb = self.path.strip("/")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            args = json.loads(self.rfile.read(length) or b"{}")
            self._send(200, {"result": self.verbs.lookup(verb)(**args)})
        except (LookupError, TypeError, ValueError, kube.KubeError, OSError) as exc:
            self._send(400, {"error": f"{type(exc).__name__}: {exc}"})

    def _send(self, code: int, body: JSON) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the agent log is for the agent."""


class ControlServer:
    """Serves the fault verbs of one agent until stopped."""

    def __init__(self, agent: runtime.Agent) -> None:
        handler = type("Handler", (_Handler,), {"verbs": Verbs(agent)})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.file = agent.ctx.settings.state_dir / ENDPOINT_FILE
        port = self.server.server_address[1]
        info = {"pid": os.getpid(), "port": port, "instance": agent.ctx.network.instance,
                "subnet": str(agent.ctx.network.subnet), "nodes": agent.nodes.names}  # fmt: skip
        _atomic_write(self.file, json.dumps(info))
        threading.Thread(target=self.server.serve_forever, name="control", daemon=True).start()

    def stop(self) -> None:
        self.file.unlink(missing_ok=True)
        self.server.shutdown()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
