"""Thin kopf wiring: watches fill the caches; one level-triggered reconcile loop per FSDPJob.

Why not kopf daemons or on.create/on.update: daemons put a finalizer on every job (a job could
not be deleted while the operator is down), and change handlers keep state in annotations. Here
kopf's event handlers only start, wake and stop a loop; all state is in the job's status and
its pods' labels, so any pass can be repeated after a crash. No decisions are made here.

What a pass observes of pods and nodes comes from kopf's in-memory indices (cache.py says why
those), copied into a `cache.View` on the event loop before the pass goes to its thread: a pass
lists nothing. Who is woken by what:

- a job's own events and its pods' events wake that job;
- a node event wakes only the jobs with pods on that node and the jobs waiting for capacity,
  and only when something a pass reads of the node changed (not a heartbeat);
- rank 0's progress is scraped by probe.Prober beside the passes; a change wakes the job;
- otherwise a job wakes at its own deadlines (decide.py), or after RESYNC_SECONDS.

Every replica watches and keeps its indices warm; only the leader of the Lease (leader.py) runs
loops. Losing the lease cancels them; winning it starts one per known job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import os
import socket
import uuid
from collections.abc import Hashable
from typing import Any

import kopf
import prometheus_client

from fsdp_operator import cache, heap, leader, metrics, names, observe, probe, reconcile
from fsdp_operator import kube as k8s
from fsdp_operator import settings as cfg
from fsdp_operator import spec as api

log = logging.getLogger(__name__)
MIN_PAUSE = 0.2  # seconds between passes of one job, however many events arrive
ERROR_PAUSE = 5.0
TRIM_SECONDS = 30.0  # free memory glibc keeps goes back to the kernel this often (heap.trim)

Key = tuple[str, str]
_loops: dict[Key, asyncio.Task[None]] = {}
_wakes: dict[Key, asyncio.Event] = {}
_wants_nodes: set[Key] = set()  # jobs whose last pass waits on node capacity
_ctx: reconcile.Context | None = None
_prober: probe.Prober | None = None
_elector: leader.Elector | None = None
_tasks: list[asyncio.Task[None]] = []
_synced = False  # set by the first non-index handler: kopf filled every index before it
_indices: dict[str, Any] = {}
_nodes_seen: dict[str, cache.NodeRecord] = {}
_node_list: list[cache.NodeRecord] | None = None
_usage = cache.Usage()
_passes: concurrent.futures.ThreadPoolExecutor | None = None  # None: asyncio's default


# --- the caches: kopf indices (no handler runs before all are filled from their listings) ------
@kopf.index("", "v1", "pods", labels={names.Label.JOB.value: kopf.PRESENT})
async def fsdp_job_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Key, Any]:
    labels = body.get("metadata", {}).get("labels") or {}
    return {(namespace or "", labels[names.Label.JOB.value]): cache.slim_pod(body)}


@kopf.index("", "v1", "pods")
async def fsdp_pod_usage(body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Feeds `_usage` (an index function: kopf runs it for every listed pod before any
    handler); the kopf index itself stays empty."""
    used = cache.usage(body)
    uid = str(body.get("metadata", {}).get("uid", ""))
    _usage.put(uid, None if used is None else (used[0], used[2]))
    return {}


@kopf.on.event("", "v1", "pods", when=lambda type, **_: type == "DELETED")
async def pod_gone(body: kopf.Body, **_: Any) -> None:
    _usage.put(str(body.get("metadata", {}).get("uid", "")), None)


@kopf.index("", "v1", "nodes")
async def fsdp_nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """Keeps `_nodes_seen` (an index function: kopf runs it for every listed node before any
    handler); the kopf index itself stays empty, as fsdp_pod_usage's."""
    global _node_list
    record = observe.node_record(body)
    if _nodes_seen.get(name) != record:  # heartbeats change nothing here: no wake-up
        first = name not in _nodes_seen
        _nodes_seen[name] = record
        _node_list = None
        if not first:
            _node_changed(name)
    return {}


@kopf.on.event("", "v1", "nodes", when=lambda type, **_: type == "DELETED")
async def node_gone(name: str, **_: Any) -> None:
    global _node_list
    _nodes_seen.pop(name, None)
    _node_list = None


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
async def fsdp_jobs(namespace: str | None, name: str, **_: Any) -> dict[Key, bool]:
    return {(namespace or "", name): True}


def _node_changed(node: str) -> None:
    pods = _indices.get("fsdp_job_pods")
    if pods is None:
        return
    woken = set(_wants_nodes)
    for (ns, _label), store in list(pods.items()):
        for pod in store:
            if pod["spec"].get("nodeName") == node:
                for owner in pod["metadata"].get("ownerReferences") or []:
                    if owner.get("kind") == api.KIND:
                        woken.add((ns, str(owner.get("name"))))
    for key in woken:
        if key in _loops:
            _poke(*key)


def _view(namespace: str, name: str) -> cache.View:
    """A copy of what the indices hold for one pass of one job (on the event loop)."""
    pods_idx = _indices.get("fsdp_job_pods") or {}
    key = cache.job_key(namespace, name)
    pods = list(pods_idx.get(key, ()))
    global _node_list
    if _node_list is None:  # one list for every view until a node changes (see Usage.totals)
        # From _nodes_seen, changed together with the invalidation (kopf stores an index
        # function's result only after it returns: a view made in between would read the old).
        _node_list = list(_nodes_seen.values())
    nodes = _node_list
    latest = _prober.take((namespace, name)) if _prober is not None else None
    return cache.View(
        pods=pods,
        nodes=nodes,
        used=_usage.totals(),
        progress=latest[1] if latest else None,
        progress_pod=latest[0] if latest else "",
    )


# --- start-up, leadership ----------------------------------------------------------------------
class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: kopf builds one on every watch event of every kind (a deep copy of the
    body, then another to clear it of progress fields) for on.create/on.update handlers to
    diff against. This operator has none (see above), yet during a mass deletion at 1,000 jobs
    that copying was a third of the event loop's busy time. With no essence, kopf's diff is
    empty and nothing is stored. tests/unit/test_handlers.py fails if a change handler is ever
    registered, since it would then never see a change."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


def _identity() -> str:
    return os.environ.get("FSDPOP_IDENTITY") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _lease_namespace(conf: cfg.Settings) -> str:
    if conf.lease_namespace:
        return conf.lease_namespace
    sa = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError), open(sa) as f:
        return f.read().strip()
    return "default"


def _leading() -> bool:
    return _elector is None or _elector.leading


def _started_leading() -> None:
    if not _synced:
        return  # the first job events start the loops, once every index is filled
    for key in list(_indices.get("fsdp_jobs") or {}):
        _poke(*key)


def _stopped_leading(why: str) -> None:
    for task in list(_loops.values()):
        task.cancel()
    if _prober is not None:
        for key in list(_loops):
            _prober.forget(key)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
    global _ctx, _prober, _elector, _passes
    conf = cfg.Settings.from_env()
    # A watch that dies silently (no error, no events) is re-opened within these bounds.
    settings.watching.server_timeout = conf.watch_server_timeout
    settings.watching.client_timeout = conf.watch_client_timeout
    settings.watching.connect_timeout = 10
    settings.posting.level = logging.WARNING  # our own Events say what happened
    settings.persistence.finalizer = f"{api.GROUP}/kopf-finalizer"  # unused: no such handlers
    settings.persistence.diffbase_storage = NoDiffBase()
    for index in ("fsdp_job_pods", "fsdp_jobs"):
        _indices[index] = kwargs[index]
    client = k8s.load_client()
    if conf.leader_election:
        _elector = leader.Elector(
            client,
            namespace=_lease_namespace(conf),
            name=conf.lease_name,
            identity=_identity(),
            on_started=_started_leading,
            on_stopped=_stopped_leading,
        )
        window = _elector.write_timeout
    else:
        metrics.LEADER.set(1)
        window = None
    _ctx = reconcile.Context(kube=k8s.Kube(client, write_window=window), settings=conf)
    _passes = concurrent.futures.ThreadPoolExecutor(conf.pass_workers, thread_name_prefix="pass")
    _prober = probe.Prober(
        on_change=_on_progress, timeout=conf.scrape_timeout_seconds,
        concurrency=conf.scrape_concurrency,
    )  # fmt: skip
    _tasks.append(asyncio.create_task(_prober.run(), name="prober"))
    if _elector is not None:
        _tasks.append(asyncio.create_task(_elector.run(), name="leader-election"))
    _tasks.append(asyncio.create_task(heap.trim_every(TRIM_SECONDS), name="malloc-trim"))
    if conf.metrics_port:
        prometheus_client.start_http_server(conf.metrics_port)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for task in list(_loops.values()):
        task.cancel()
    await asyncio.gather(*_loops.values(), return_exceptions=True)
    for task in _tasks:
        task.cancel()
    if _elector is not None:
        await _elector.release()


@kopf.on.probe(id="loops")
def loops_probe(**_: Any) -> int:
    return sum(1 for t in _loops.values() if not t.done())


@kopf.on.probe(id="leader")
def leader_probe(**_: Any) -> bool:
    return _leading()


def _on_progress(key: Hashable) -> None:
    if isinstance(key, tuple) and key in _loops:
        _poke(*key)


# --- the per-job loop ----------------------------------------------------------------------------
async def _loop(namespace: str, name: str) -> None:
    key = (namespace, name)
    wake = _wakes.setdefault(key, asyncio.Event())
    assert _ctx is not None
    try:
        while True:
            wake.clear()
            try:
                # The view is made here and dropped with the pass: a loop asleep holds no copy
                # (1,000 jobs would keep 1,000 copies of every node's usage).
                outcome = await asyncio.get_running_loop().run_in_executor(
                    _passes, reconcile.run_pass, _ctx, namespace, name, _view(namespace, name)
                )
                pause = MIN_PAUSE
            except k8s.NotLeader:
                return  # leadership is gone: _stopped_leading cancels the other loops too
            except Exception:  # a pass failed half-way: the next pass finishes it
                log.exception("reconcile of %s/%s failed", namespace, name)
                # Back off for real: watch events must not turn a failing pass (say, a namespace
                # being deleted refuses every create) into a hot loop that starves other jobs.
                outcome, pause = reconcile.Outcome(ERROR_PAUSE), ERROR_PAUSE
            if outcome is None:
                if not wake.is_set():
                    break  # the job is gone, and no event for its name came during the pass
                # An event came during the pass: perhaps a new job of the same name, perhaps a
                # pod of the gone one being collected. Look again, after the usual pause.
                delay = pause
            else:
                delay = outcome.delay
                if _prober is not None:
                    _prober.want(key, outcome.probe)
                if outcome.wants_nodes:
                    _wants_nodes.add(key)
                else:
                    _wants_nodes.discard(key)
            await asyncio.sleep(pause)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=max(0.0, delay - pause))
    finally:
        if _loops.get(key) is asyncio.current_task():  # not replaced by a new job's loop
            _loops.pop(key, None)
            _wakes.pop(key, None)
            _wants_nodes.discard(key)
            if _prober is not None:
                _prober.forget(key)
            metrics.forget(namespace, name)  # a standby shows no other replica's jobs
            reconcile.own_writes.pop(key, None)


def _poke(namespace: str, name: str) -> None:
    if not _leading():
        return  # a standby: its indices are kept, its loops start when it leads
    key = (namespace, name)
    task = _loops.get(key)
    if task is None or task.done():
        _wakes.pop(key, None)
        # A fresh context: the loop must not keep the kopf event (a whole body, its patch and
        # logger, in kopf's context variables) that happened to start it, for the job's life.
        _loops[key] = asyncio.create_task(
            _loop(namespace, name), name=f"fsdpjob/{name}", context=contextvars.Context()
        )
    elif key in _wakes:
        _wakes[key].set()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def job_event(
    namespace: str | None, name: str, body: kopf.Body, type: str | None, **_: Any
) -> None:
    global _synced
    _synced = True
    if namespace is None:
        return
    version = body.get("metadata", {}).get("resourceVersion")
    if type == "MODIFIED" and version and reconcile.own_writes.get((namespace, name)) == version:
        reconcile.own_writes.pop((namespace, name), None)
        return  # the echo of this replica's own status write
    # Also on DELETED: the loop's next pass finds no job and ends by itself. Cancelling it here
    # would race with a new job of the same name, whose ADDED event kopf may handle first
    # (it serialises events per uid, not per name), and leave that job with no loop at all.
    _poke(namespace, name)


@kopf.on.event("", "v1", "pods", labels={names.Label.JOB.value: kopf.PRESENT})
async def pod_event(body: kopf.Body, namespace: str | None, **_: Any) -> None:
    global _synced
    _synced = True
    for owner in body.get("metadata", {}).get("ownerReferences") or []:
        key = (namespace or "", str(owner.get("name")))
        if owner.get("kind") == api.KIND and key in _loops:
            _poke(*key)
