"""A small dict-in, dict-out Kubernetes REST client for the agent.

The agent speaks to the API server the way a kubelet does (node status, leases, pod status,
watches), so it wants raw JSON and explicit patch types rather than generated models. This
module borrows only authentication and transport from the ``kubernetes`` package. It holds no
agent logic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

JSON = dict[str, Any]
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class KubeError(RuntimeError):
    """The API server answered with a non-2xx status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Kube:
    """One authenticated connection pool to the API server (thread-safe for requests)."""

    def __init__(self, kubeconfig: Path) -> None:
        self._api = kube_config.new_client_from_config(  # type: ignore[no-untyped-call, unused-ignore]
            config_file=str(kubeconfig)
        )

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] = 30.0,
    ) -> Any:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        _, url, headers, _, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self._api.call_api(
                method, url, header_params=headers, body=body, _request_timeout=timeout
            )
        except (urllib3.exceptions.HTTPError, OSError, ApiException) as exc:
            # Transport trouble (API server restarting, timeouts) is one more API error to the
            # callers, who all retry on their own schedule.
            raise KubeError(0, f"{method} {path}: {exc}") from exc
        if not 200 <= resp.status < 300:
            data = resp.read()
            try:
                message = json.loads(data).get("message", data)
            except ValueError:
                message = data
            raise KubeError(resp.status, str(message))
        return resp

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One request; the decoded JSON answer. Raises :class:`KubeError` on non-2xx."""
        resp = self._send(method, path, query=query, body=body, content_type=content_type)
        data = resp.read()
        decoded: JSON = json.loads(data) if data else {}
        return decoded

    def get(self, path: str, **query: Any) -> JSON:
        return self.request("GET", path, query=query)

    def get_or_none(self, path: str) -> JSON | None:
        try:
            return self.get(path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def watch(self, path: str, *, resource_version: str, timeout_s: int = 300) -> Iterator[JSON]:
        """Stream watch events (``{"type", "object"}``) until the server closes the watch."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        resp = self._send("GET", path, query=query, timeout=(10.0, timeout_s + 30.0))
        buffer = b""
        try:
            for chunk in resp.response.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.response.release_conn()
