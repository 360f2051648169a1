"""A lost node seen from its Lease in `kube-node-lease`, before the node controller says NotReady.

A kubelet renews its node's Lease every quarter of the Lease's duration (10 s of 40 s by
default). The node controller marks the node NotReady only after `node-monitor-grace-period`
(50 s since Kubernetes 1.32), and a job's `nodeLossGraceSeconds` comes on top of that. The
operator watches the Leases (one namespace, read-only) and measures how long each node has been
silent by this process's monotonic clock: a renewal is a change of `spec.renewTime` seen here,
never the time written in it (another machine's clock).

It acts only on evidence. A node is lost when it missed `missed` renewals in a row (silent for
`missed` + SLACK renew periods: a renewal a little late is not missed) while the watch was
healthy: open, and delivering other nodes' renewals (none missing for two renew periods). An
API server that stalls, or a watch that falls behind or reconnects, silences every node at
once: the clock then stops for all of them and starts again only when renewals flow, so no
node looks lost because the operator could not see. One node alone (nothing to compare
with) is never lost this way; NotReady still catches it.

`LeaseClock` is the bookkeeping (no I/O; unit-tested with a fake clock); `LeaseWatch` feeds it
from a watch on its own thread, as raw JSON lines (a fleet's kwok nodes renew hundreds of
Leases a second).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

NAMESPACE = "kube-node-lease"
RENEW_FRACTION = 0.25
"""A kubelet renews every this much of its Lease's duration (nodeLeaseRenewIntervalFraction)."""
DEFAULT_DURATION = 40.0
SLACK = 0.25
"""Of a renew period: how late a renewal may be and still count as on time."""


@dataclasses.dataclass
class _Node:
    renew: str
    at: float  # this process's monotonic time when it saw `renew` change
    period: float


class LeaseClock:
    """Per node: when this process last saw its Lease renewed; which nodes are lost."""

    def __init__(self, *, missed: int, clock: Callable[[], float] = time.monotonic) -> None:
        if missed < 1:
            raise ValueError(f"missed renewals ({missed}) must be at least 1")
        self.missed = missed
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._open = False
        self._last_any: float | None = None  # newest renewal of any node seen
        self._healthy_since: float | None = None

    # --- fed by the watch -------------------------------------------------------------------
    def opened(self) -> None:
        """A listing starts a new watch: health is earned again from the renewals that follow."""
        with self._lock:
            self._open, self._healthy_since = True, None

    def closed(self) -> None:
        with self._lock:
            self._open, self._healthy_since = False, None

    def seen(self, lease: Mapping[str, Any]) -> None:
        """An ADDED or MODIFIED Lease (or one of a listing)."""
        name = str(lease.get("metadata", {}).get("name", ""))
        spec = lease.get("spec") or {}
        renew = str(spec.get("renewTime") or "")
        duration = float(spec.get("leaseDurationSeconds") or DEFAULT_DURATION)
        if not name:
            return
        now = self._clock()
        with self._lock:
            old = self._nodes.get(name)
            if old is not None and old.renew == renew:
                old.period = duration * RENEW_FRACTION
                return
            self._nodes[name] = _Node(renew, now, duration * RENEW_FRACTION)
            if old is None:
                return  # a first sighting (a listing, a new node) is no renewal
            if self._open and (self._healthy_since is None or self._stalled(now)):
                self._healthy_since = now  # renewals flow again: the clocks restart here
                log.info("node Leases renew (%s first): judging nodes by them from now", name)
            self._last_any = now

    def gone(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)

    def keep_only(self, names: set[str]) -> None:
        """After a listing: forget the Leases deleted while the watch was away."""
        with self._lock:
            for name in set(self._nodes) - names:
                del self._nodes[name]

    # --- read by the operator ---------------------------------------------------------------
    def lost(self) -> dict[str, float]:
        """Nodes silent for `missed` renewals while the watch was healthy: name -> seconds
        since their last renewal this process saw (or since renewals flowed again)."""
        now = self._clock()
        with self._lock:
            if not self._open or self._healthy_since is None or self._stalled(now):
                return {}
            found = {}
            for name, node in self._nodes.items():
                silent = now - max(node.at, self._healthy_since)
                if silent >= (self.missed + SLACK) * node.period:
                    found[name] = now - node.at
            return found

    def quiet(self) -> dict[str, float]:
        """Nodes that missed one renewal (lost ones too) while the watch was healthy: the jobs
        with pods there are scraped at once and often, so the verdict when the Lease is lost
        can ask whether training went on (detect.py: silence alone is not a loss)."""
        now = self._clock()
        with self._lock:
            if not self._open or self._healthy_since is None or self._stalled(now):
                return {}
            return {
                name: now - node.at
                for name, node in self._nodes.items()
                if now - max(node.at, self._healthy_since) >= (1 + SLACK) * node.period
            }

    def renewed(self) -> dict[str, tuple[float, float]]:
        """Every node's seconds since its last renewal this process saw, with its renew period,
        while the watch is healthy (else none: a stalled stream says nothing of any node). A
        node that renewed after its pod's keeper fell silent is alive: the pod is frozen, not
        lost (policy/detect.py's early suspicion)."""
        now = self._clock()
        with self._lock:
            if not self._open or self._healthy_since is None or self._stalled(now):
                return {}
            return {name: (now - node.at, node.period) for name, node in self._nodes.items()}

    def healthy(self) -> bool:
        with self._lock:
            return (
                self._open and self._healthy_since is not None and not self._stalled(self._clock())
            )

    def _stalled(self, now: float) -> bool:
        """No node renewed for two renew periods: the stream (or the API server) stalls."""
        if self._last_any is None:
            return True
        period = max((n.period for n in self._nodes.values()), default=DEFAULT_DURATION / 4)
        return now - self._last_any > 2 * period


class LeaseWatch:
    """Keeps a `LeaseClock` fed from a watch on `namespace`'s Leases, on a daemon thread."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        clock: LeaseClock,
        *,
        namespace: str = NAMESPACE,
        timeout_seconds: int = 60,
        retry_seconds: float = 2.0,
    ) -> None:
        self.clock = clock
        self.namespace = namespace
        self._api = kubernetes.client.CoordinationV1Api(client)
        self._timeout = timeout_seconds
        self._retry = retry_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="node-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.clock.closed()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._list()
                while version and not self._stop.is_set():
                    version = self._watch(version)
            except (ApiException, OSError, ValueError) as exc:
                log.warning("watch of Leases in %s failed: %s", self.namespace, exc)
            except Exception:  # the thread must outlive any one failure
                log.exception("watch of Leases in %s failed", self.namespace)
            self.clock.closed()
            self._stop.wait(self._retry)

    def _list(self) -> str:
        listed = self._api.list_namespaced_lease(self.namespace, _preload_content=False)
        doc = json.loads(listed.data)
        self.clock.opened()
        items = doc.get("items") or []
        log.info("watching %d node Leases in %s", len(items), self.namespace)
        for lease in items:
            self.clock.seen(lease)
        self.clock.keep_only({str(lease.get("metadata", {}).get("name")) for lease in items})
        return str(doc.get("metadata", {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """One watch request until the server ends it; the version to go on from ('' when
        the history is gone and a new listing is needed)."""
        resp = self._api.list_namespaced_lease(
            self.namespace,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout,
            _preload_content=False,
            _request_timeout=(10, self._timeout + 30),
        )
        try:
            for event in _events(resp):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return ""  # 410 Gone and the like: list again
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED"):
                    self.clock.seen(obj)
                elif kind == "DELETED":
                    self.clock.gone(str(obj.get("metadata", {}).get("name", "")))
                if self._stop.is_set():
                    break
        finally:
            resp.release_conn()
        return version


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    """Watch events from a streamed response, one JSON document per line."""
    pending = b""
    for chunk in resp.stream(65536, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
