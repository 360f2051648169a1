"""leader.Elector against the real API server, with short timings: one leads at a time, a dead
leader's lease is taken only once it expired, a released one at the standby's next try."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import kubernetes
import pytest

from fsdp_operator.io import leader
from localcluster import controlplane

pytestmark = pytest.mark.cluster
T = leader.Timings(lease_seconds=3.0, renew_deadline_seconds=2.0, retry_seconds=0.5)


def test_one_leads_a_dead_leaders_lease_is_taken_only_after_it_expired(
    cluster: controlplane.Cluster,
) -> None:
    client = kubernetes.config.new_client_from_config(str(cluster.kubeconfig))
    lease = f"test-{uuid.uuid4().hex[:8]}"
    log: list[tuple[str, str]] = []

    def elector(identity: str) -> leader.Elector:
        return leader.Elector(
            client,
            namespace="default",
            name=lease,
            identity=identity,
            timings=T,
            on_started=lambda: log.append((identity, "started")),
            on_stopped=lambda why: log.append((identity, why)),
        )

    async def until(cond: object, timeout: float) -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not cond():  # type: ignore[operator]
            assert loop.time() - start < timeout
            await asyncio.sleep(0.02)
        return loop.time() - start

    async def scenario() -> tuple[float, float, int]:
        a, b, c = elector("a"), elector("b"), elector("c")
        ta = asyncio.create_task(a.run())
        await until(lambda: a.leading, 10)
        tb = asyncio.create_task(b.run())
        both = 0
        for _ in range(100):  # 2 s: b stands by while a renews
            both += a.leading and b.leading
            await asyncio.sleep(0.02)
        assert a.leading and not b.leading
        ta.cancel()  # a dies: no release, its lease runs out
        taken = await until(lambda: b.leading, 10)
        tc = asyncio.create_task(c.run())
        await asyncio.sleep(1.0)
        assert not c.leading
        await b.release()
        tb.cancel()
        handed = await until(lambda: c.leading, 5)
        tc.cancel()
        await c.release()
        return taken, handed, both

    taken, handed, both = asyncio.run(scenario())
    assert both == 0
    # a renewed at most one retry before it died: b may not lead before the rest of the lease.
    assert taken >= T.lease_seconds - T.retry_seconds - 0.1
    assert handed < T.lease_seconds  # released: taken at the next try, not on its expiry
    assert ("b", "shutting down") in log and log[0] == ("a", "started")


def test_a_release_during_a_renewal_is_written_after_it_and_never_taken_back(
    cluster: controlplane.Cluster,
) -> None:
    """SIGTERM can come while a renewal is between its read and its write (cancelling the task
    does not stop its thread). The release must not be refused for it (409), or the standby
    waits out the whole lease; and the finished renewal must not make the replica lead again."""
    client = kubernetes.config.new_client_from_config(str(cluster.kubeconfig))
    coord = kubernetes.client.CoordinationV1Api(client)
    lease = f"test-{uuid.uuid4().hex[:8]}"
    b = leader.Elector(
        client,
        namespace="default",
        name=lease,
        identity="b",
        timings=T,
        on_started=lambda: None,
        on_stopped=lambda why: None,
    )
    real_replace = b.api.replace_namespaced_lease
    armed, in_renewal = threading.Event(), threading.Event()

    def slow_renewal(*args: object, **kwargs: object) -> object:
        if armed.is_set():  # the renewal: it has read the Lease; hold its write back
            armed.clear()
            in_renewal.set()
            time.sleep(0.5)
        return real_replace(*args, **kwargs)

    b.api.replace_namespaced_lease = slow_renewal  # type: ignore[method-assign]

    def holder() -> str:
        resp = coord.read_namespaced_lease(lease, "default", _preload_content=False)
        return str(json.loads(resp.data)["spec"].get("holderIdentity") or "")

    async def scenario() -> tuple[str, str, bool]:
        tb = asyncio.create_task(b.run())
        while not b.leading:
            await asyncio.sleep(0.02)
        armed.set()
        while not in_renewal.is_set():
            await asyncio.sleep(0.01)
        await b.release()
        released = await asyncio.to_thread(holder)
        await asyncio.sleep(T.retry_seconds * 3)  # b's loop keeps running: it must not take it
        later = await asyncio.to_thread(holder)
        tb.cancel()
        return released, later, b.leading

    released, later, leading = asyncio.run(scenario())
    assert (released, later, leading) == ("", "", False)


def test_timings_must_leave_a_margin() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        leader.Timings(lease_seconds=10, renew_deadline_seconds=10, retry_seconds=2)
