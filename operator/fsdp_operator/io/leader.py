"""Leader election on a `coordination.k8s.io/v1` Lease, the way Kubernetes' controllers do it.

Every replica watches and keeps its caches (kopf's indices) warm; only the leader runs passes.
The timings are client-go's defaults: a lease lasts 15 s, the leader renews every 2 s and gives
up acting 10 s after its last successful renewal (the renew deadline), so it has stopped 5 s
before any standby may take the lease (15 s after it last saw the lease change). Two replicas
never act at once:

- `window()` is read before every write (kube.Kube), not only by this module's task: a leader
  whose renewals hang stops writing at its deadline even if its event loop is busy;
- each write's timeout ends before the lease could expire, and sockets close with a reset
  (kube.load_client), so a write stuck in a cut connection is dropped, not delivered late;
- acquiring is an update with the Lease's resourceVersion: of two standbys, one wins.

A clean shutdown releases the Lease (holder cleared, duration 1 s), so a standby takes over at
its next try (<= 2 s), not 15 s later. The clock for every expiry is this process's monotonic
clock, measured from when a request was sent (never the other replica's wall clock).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from fsdp_operator.io import metrics

log = logging.getLogger(__name__)
RELEASE_TRIES = 3


@dataclasses.dataclass(frozen=True)
class Timings:
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
            raise ValueError(
                f"leader election timings need 0 < retry ({self.retry_seconds}) < renew "
                f"deadline ({self.renew_deadline_seconds}) < lease ({self.lease_seconds})"
            )


def _micro(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        timings: Timings | None = None,
        on_started: Callable[[], None],
        on_stopped: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = kubernetes.client.CoordinationV1Api(client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.t = timings or Timings()
        self._on_started, self._on_stopped = on_started, on_stopped
        self._clock = clock
        self._leading = False
        self._renewed = float("-inf")  # send time of the last successful acquire/renew
        self._seen: tuple[Any, ...] | None = None  # the other holder's record, as last read
        self._seen_at = float("-inf")
        self.transitions = 0
        # One request sequence at a time: a renewal already in its thread when release() is
        # called would otherwise change the Lease under the release (409, and the standby waits
        # for the whole lease). Cancelling the task that awaits a thread does not stop it.
        self._io = threading.Lock()
        self._released = False  # after a release, never take the lease again

    # --- what the rest of the operator reads ----------------------------------------------------
    def window(self) -> float:
        """Seconds this replica may still act (<= 0: it must not write)."""
        if not self._leading:
            return 0.0
        return self._renewed + self.t.renew_deadline_seconds - self._clock()

    def write_timeout(self) -> float:
        """window(), unless writing is allowed: then the time until the lease could expire."""
        if self.window() <= 0:
            return 0.0
        return self._renewed + self.t.lease_seconds - self._clock()

    @property
    def leading(self) -> bool:
        return self.window() > 0

    # --- the loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        watchdog = asyncio.create_task(self._watchdog())
        try:
            while True:
                sent = self._clock()
                try:
                    ok = await asyncio.to_thread(self._try, sent)
                except Exception as exc:  # the API server unreachable, or refusing: try again
                    log.warning("leader election: %s", _describe(exc))
                    ok = False
                if ok and not self._released:  # a renewal the release waited for starts nothing
                    self._renewed = max(self._renewed, sent)
                    # A success that came back after the deadline starts nothing: the next try,
                    # sent now, must succeed first.
                    if not self._leading and self._renewed + self.t.renew_deadline_seconds > (
                        self._clock()
                    ):
                        self._leading = True
                        self.transitions += 1
                        metrics.LEADER.set(1)
                        log.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)
                        self._on_started()
                await asyncio.sleep(max(0.0, self._next_try(sent) - self._clock()))
        finally:
            watchdog.cancel()

    def _next_try(self, sent: float) -> float:
        """Every retry period; a standby also tries the moment the holder's lease runs out as it
        saw it (not up to a retry period later)."""
        at = sent + self.t.retry_seconds
        if not self._leading and self._seen is not None and self._seen[0]:
            duration = float(self._seen[2] or self.t.lease_seconds)
            expiry = self._seen_at + duration + 0.01
            if self._clock() < expiry < at:
                return expiry
        return at

    async def _watchdog(self) -> None:
        """Stops leading at the renew deadline, even while a renewal hangs in its thread."""
        while True:
            if self._leading and self.window() <= 0:
                self._stop("its lease was not renewed within the renew deadline")
            await asyncio.sleep(0.1)

    def _stop(self, why: str) -> None:
        self._leading = False
        metrics.LEADER.set(0)
        log.warning("%s stops leading: %s", self.identity, why)
        self._on_stopped(why)

    def _timeout(self, sent: float) -> float:
        """A request never outlives the time it could still be useful."""
        if self._leading:
            return max(0.5, self._renewed + self.t.renew_deadline_seconds - sent)
        return self.t.retry_seconds * 2

    def _try(self, sent: float) -> bool:
        """One try to acquire or renew (blocking); True when this replica holds the lease."""
        with self._io:
            if self._released:
                return False
            return self._try_locked(sent)

    def _try_locked(self, sent: float) -> bool:
        timeout = self._timeout(sent)
        try:
            resp = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(timeout)
        lease = json.loads(resp.data)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._seen:
            self._seen, self._seen_at = record, self._clock()
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.t.lease_seconds)
            if self._clock() < self._seen_at + duration:
                if self._leading:
                    self._stop(f"the lease is held by {holder}")
                return False  # someone else's, and not expired as far as this replica saw
        now = time.time()
        mine = holder == self.identity
        lease["spec"] = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.t.lease_seconds),
            "renewTime": _micro(now),
            "acquireTime": spec.get("acquireTime") if mine else _micro(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if mine else 1),
        }
        try:  # carries metadata.resourceVersion: a concurrent writer makes this a 409
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _create(self, timeout: float) -> bool:
        now = _micro(time.time())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.t.lease_seconds),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def release(self) -> None:
        """A clean shutdown: stop acting, then hand the lease back for a standby to take now.

        Waits for a renewal already under way, so the release is written after it, not refused
        because of it; from then on this replica takes no lease."""
        self._released = True
        if not self._leading:
            return
        self._stop("shutting down")
        try:
            await asyncio.to_thread(self._release)
        except Exception as exc:
            log.warning("leader election: release failed: %s", _describe(exc))

    def _release(self) -> None:
        with self._io:
            for _ in range(RELEASE_TRIES):
                resp = self.api.read_namespaced_lease(
                    self.name, self.namespace, _preload_content=False, _request_timeout=5
                )
                lease = json.loads(resp.data)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.identity:
                    return
                now = _micro(time.time())
                lease["spec"] = {
                    **spec,
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": now,
                    "acquireTime": now,
                }
                try:
                    self.api.replace_namespaced_lease(
                        self.name, self.namespace, lease, _request_timeout=5
                    )
                except ApiException as exc:
                    if exc.status == 409:  # written since the read: read it again
                        continue
                    raise
                log.info("%s released lease %s/%s", self.identity, self.namespace, self.name)
                return
            log.warning("leader election: release gave up after %d conflicts", RELEASE_TRIES)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"API error {exc.status}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
