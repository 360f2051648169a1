"""leader.Elector against the real API server, with short timings: one leads at a time, a dead
leader's lease is taken only once it expired, a released one at the standby's next try."""

from __future__ import annotations

import asyncio
import uuid

import kubernetes
import pytest

from fsdp_operator import leader
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
            client, namespace="default", name=lease, identity=identity, timings=T,
            on_started=lambda: log.append((identity, "started")),
            on_stopped=lambda why: log.append((identity, why)),
        )  # fmt: skip

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


def test_timings_must_leave_a_margin() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        leader.Timings(lease_seconds=10, renew_deadline_seconds=10, retry_seconds=2)
