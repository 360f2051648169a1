"""One operator process, wired together: the watches' store, the reconciler, the per-job loops,
rank 0's scraper and the leader election.

handlers.py (the kopf glue) builds one at start-up and keeps it in kopf's memo; a test builds
its own around a fake reconciler. Who is woken by what:

- a job's own events and its pods' events wake that job;
- a node event wakes only the jobs with pods on that node and the jobs waiting for capacity,
  and only when something a pass reads of the node changed (not a heartbeat);
- rank 0's progress is scraped by probe.Prober beside the passes; a change wakes the job;
- a node lost by its Lease (nodelease.py, checked every LEASE_TICK_SECONDS) wakes the jobs with
  pods on it, and one that renews again the jobs waiting for capacity;
- otherwise a job wakes at its own deadlines (decide.py), or after its Outcome's delay.

Every replica keeps its store warm; only the leader of the Lease (leader.py) runs loops. Losing
the lease cancels them; winning it starts one per known job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

from fsdp_operator.io import cache, gang, gangkey, heap, kube, leader, metrics, nodelease, probe
from fsdp_operator.run import loops, reconcile, settings
from fsdp_operator.types import api

log = logging.getLogger(__name__)
Key = tuple[str, str]
TRIM_SECONDS = 30.0  # free memory glibc keeps goes back to the kernel this often (heap.trim)
LEASE_TICK_SECONDS = 0.5  # how often the node Lease clock is read for nodes lost or back


class Passes(Protocol):
    """What the manager needs of a reconciler (reconcile.Reconciler; a fake in tests)."""

    def run_pass(self, namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        """Blocking: run on the manager's pass threads."""

    def is_echo(self, namespace: str, name: str, version: str | None) -> bool: ...

    def forget(self, namespace: str, name: str) -> None: ...

    def close(self) -> None: ...


class Manager:
    def __init__(
        self,
        reconciler: Passes,
        *,
        config: settings.Settings,
        store: cache.Store | None = None,
        prober: probe.Prober | None = None,
        elector: leader.Elector | None = None,
        leases: nodelease.LeaseWatch | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.settings = config
        self.store = store if store is not None else cache.Store()
        self.prober = prober
        self.elector = elector
        self.leases = leases
        self.jobs: Mapping[Key, Any] = {}
        """kopf's `fsdp_jobs` index (every FSDPJob known), given at start-up."""
        self.synced = False
        """Set by the first job or pod event: kopf filled every index before it."""
        self._passes = concurrent.futures.ThreadPoolExecutor(
            config.pass_workers, thread_name_prefix="pass"
        )
        self._tasks: list[asyncio.Task[None]] = []
        backoff = loops.Backoff(
            initial=config.error_backoff_initial_seconds,
            maximum=config.error_backoff_max_seconds,
        )
        self.loops = loops.Loops(
            self._run_pass,
            backoff=backoff,
            min_pause=config.min_pause_seconds,
            leading=self.leading,
            on_outcome=self._on_outcome,
            on_end=self._on_end,
        )

    @classmethod
    def build(cls, config: settings.Settings, *, identity: str, lease_namespace: str) -> Manager:
        """The real thing: an API client from the pod's (or the kubeconfig's) credentials."""
        client = kube.load_client()
        manager: Manager | None = None

        def started() -> None:
            if manager is not None:
                manager.started_leading()

        def stopped(why: str) -> None:
            if manager is not None:
                manager.stopped_leading(why)

        elector = None
        if config.leader_election:
            elector = leader.Elector(
                client,
                namespace=lease_namespace,
                name=config.lease_name,
                identity=identity,
                on_started=started,
                on_stopped=stopped,
            )
        else:
            metrics.LEADER.set(1)
        window = elector.write_timeout if elector is not None else None
        # Every attempt's gang key derives from it: had before the first pass, or no start.
        master = gangkey.master_key(client, lease_namespace)
        gang_client = gang.GangClient(master)
        reconciler = reconcile.Reconciler(
            kube.Kube(client, write_window=window), config, gang_client=gang_client
        )
        leases = None
        if config.node_lease_missed_renewals > 0:
            clock = nodelease.LeaseClock(missed=config.node_lease_missed_renewals)
            leases = nodelease.LeaseWatch(
                client,
                clock,
                namespace=config.node_lease_namespace,
                timeout_seconds=config.watch_server_timeout,
            )
        manager = cls(reconciler, config=config, elector=elector, leases=leases)
        manager.prober = probe.Prober(
            on_change=manager.on_progress,
            timeout=config.scrape_timeout_seconds,
            concurrency=config.scrape_concurrency,
            ask_gang=probe.gang_asker(gang_client),
        )
        return manager

    # --- lifetime -------------------------------------------------------------------------------
    def start(self) -> None:
        """The background tasks (on the running event loop)."""
        if self.prober is not None:
            self._tasks.append(asyncio.create_task(self.prober.run(), name="prober"))
        if self.elector is not None:
            self._tasks.append(asyncio.create_task(self.elector.run(), name="leader-election"))
        if self.leases is not None:
            self.leases.start()
            self._tasks.append(asyncio.create_task(self._watch_leases(), name="node-leases"))
        trim = heap.trim_every(TRIM_SECONDS)
        self._tasks.append(asyncio.create_task(trim, name="malloc-trim"))

    async def stop(self) -> None:
        await self.loops.stop()
        for task in self._tasks:
            task.cancel()
        if self.leases is not None:
            self.leases.stop()
        if self.elector is not None:
            await self.elector.release()
        self.reconciler.close()
        self._passes.shutdown(wait=False, cancel_futures=True)

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def started_leading(self) -> None:
        if not self.synced:
            return  # the first job events start the loops, once every index is filled
        for key in list(self.jobs):
            self.loops.poke(*key)

    def stopped_leading(self, why: str) -> None:
        for key in self.loops.cancel_all():
            if self.prober is not None:
                self.prober.forget(key)

    # --- what the watches report ----------------------------------------------------------------
    def job_event(
        self, namespace: str, name: str, *, type_: str | None, version: str | None
    ) -> None:
        self.synced = True
        if type_ == "MODIFIED" and self.reconciler.is_echo(namespace, name, version):
            return  # the echo of this replica's own status write
        # Also on DELETED: the loop's next pass finds no job and ends by itself. Cancelling it
        # here would race with a new job of the same name, whose ADDED event kopf may handle
        # first (it serialises events per uid, not per name), and leave that job with no loop.
        self.loops.poke(namespace, name)

    def pod_event(self, namespace: str, owners: list[dict[str, Any]]) -> None:
        self.synced = True
        self.loops.wake(
            {(namespace, str(o.get("name"))) for o in owners if o.get("kind") == api.KIND}
        )

    def node_seen(self, record: cache.NodeRecord) -> None:
        if self.store.node_seen(record):
            self.loops.wake(self.store.jobs_on_node(record.name, api.KIND) | self.loops.wants_nodes)

    async def _watch_leases(self) -> None:
        assert self.leases is not None
        while True:
            await asyncio.sleep(LEASE_TICK_SECONDS)
            clock = self.leases.clock
            self.leases_read(clock.lost(), healthy=clock.healthy(), quiet=clock.quiet())
            wall = time.time()  # a pass's clock (reconcile.Reconciler): when each was renewed
            self.store.lease_renewed = {
                n: (wall - ago, period) for n, (ago, period) in clock.renewed().items()
            }

    def leases_read(
        self, lost: dict[str, float], *, healthy: bool, quiet: Mapping[str, float] | None = None
    ) -> None:
        """The nodes lost by their Leases now (and those that missed a renewal): wake whom a
        change concerns. A node newly quiet wakes its jobs, whose next pass scrapes rank 0 at
        once and every second while it stays so."""
        before, quiet_before = self.store.lease_lost, self.store.lease_quiet
        self.store.lease_lost = lost
        self.store.lease_quiet = frozenset(quiet or lost)
        metrics.NODES_LEASE_LOST.set(len(lost))
        metrics.NODE_LEASES_HEALTHY.set(1 if healthy else 0)
        wake: set[Key] = set()
        for name in self.store.lease_quiet - quiet_before:
            wake |= self.store.jobs_on_node(name, api.KIND)
        for name in lost.keys() - before.keys():
            log.warning("node %s lost: no Lease renewal seen for %.1fs", name, lost[name])
            wake |= self.store.jobs_on_node(name, api.KIND)
        if back := before.keys() - lost.keys():
            log.info("node(s) %s renew their Leases again", ", ".join(sorted(back)))
            wake |= self.loops.wants_nodes  # room to grow back
        if wake:
            self.loops.wake(wake)

    def on_progress(self, key: Hashable) -> None:
        if isinstance(key, tuple) and key in self.loops:
            self.loops.poke(*key)

    # --- the loops' callbacks -------------------------------------------------------------------
    async def _run_pass(self, namespace: str, name: str) -> reconcile.Outcome | None:
        # The view is made here and dropped with the pass: a loop asleep holds no copy (1,000
        # jobs would keep 1,000 copies of every node's usage).
        key = (namespace, name)
        latest = self.prober.take(key) if self.prober is not None else None
        health = self.prober.health(key) if self.prober is not None else None
        view = self.store.view(namespace, name, latest, health)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._passes, self.reconciler.run_pass, namespace, name, view
            )
        except BaseException:
            if latest is not None and self.prober is not None:
                self.prober.give_back(key, latest)
            raise

    def _on_outcome(self, key: Key, outcome: reconcile.Outcome) -> None:
        if self.prober is not None:
            self.prober.want(key, outcome.probe)

    def _on_end(self, key: Key) -> None:
        if self.prober is not None:
            self.prober.forget(key)
        metrics.forget(*key)  # a standby shows no other replica's jobs
        self.reconciler.forget(*key)
