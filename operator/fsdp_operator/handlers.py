"""Thin kopf wiring: one level-triggered reconcile loop per FSDPJob, woken by watch events.

Why not kopf daemons or on.create/on.update: daemons put a finalizer on every job (a job could
not be deleted while the operator is down), and change handlers keep state in annotations. Here
kopf's event handlers only start, wake and stop a loop; all state is in the job's status and
its pods' labels, so any pass can be repeated after a crash. No decisions are made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
import prometheus_client

from fsdp_operator import kube as k8s
from fsdp_operator import metrics, names, reconcile
from fsdp_operator import settings as cfg
from fsdp_operator import spec as api

log = logging.getLogger(__name__)
MIN_PAUSE = 0.2  # seconds between passes of one job, however many events arrive
ERROR_PAUSE = 5.0

_loops: dict[tuple[str, str], asyncio.Task[None]] = {}
_wakes: dict[tuple[str, str], asyncio.Event] = {}
_ctx: reconcile.Context | None = None


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _ctx
    conf = cfg.Settings.from_env()
    # A watch that dies silently (no error, no events) is re-opened within these bounds.
    settings.watching.server_timeout = conf.watch_server_timeout
    settings.watching.client_timeout = conf.watch_client_timeout
    settings.watching.connect_timeout = 10
    settings.posting.level = logging.WARNING  # our own Events say what happened
    settings.persistence.finalizer = f"{api.GROUP}/kopf-finalizer"  # unused: no such handlers
    _ctx = reconcile.Context(kube=k8s.Kube(k8s.load_client()), settings=conf)
    if conf.metrics_port:
        prometheus_client.start_http_server(conf.metrics_port)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for task in list(_loops.values()):
        task.cancel()


@kopf.on.probe(id="loops")
def loops_probe(**_: Any) -> int:
    return sum(1 for t in _loops.values() if not t.done())


async def _loop(namespace: str, name: str) -> None:
    key = (namespace, name)
    wake = _wakes.setdefault(key, asyncio.Event())
    assert _ctx is not None
    while True:
        wake.clear()
        try:
            delay = await asyncio.to_thread(reconcile.run_pass, _ctx, namespace, name)
            pause = MIN_PAUSE
        except Exception:  # a pass failed half-way: the next pass finishes it
            log.exception("reconcile of %s/%s failed", namespace, name)
            # Back off for real: watch events must not turn a failing pass (say, a namespace
            # being deleted refuses every create) into a hot loop that starves other jobs.
            delay = pause = ERROR_PAUSE
        if delay is None:
            if not wake.is_set():
                break  # the job is gone, and no event for its name came during the pass
            # An event came during the pass: perhaps a new job of the same name, perhaps a pod
            # of the gone one being collected. Look again, after the usual pause (no hot loop).
            delay = pause
        await asyncio.sleep(pause)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=max(0.0, delay - pause))
    _loops.pop(key, None)
    _wakes.pop(key, None)
    metrics.forget(namespace, name)


def _poke(namespace: str, name: str) -> None:
    key = (namespace, name)
    task = _loops.get(key)
    if task is None or task.done():
        _loops[key] = asyncio.create_task(_loop(namespace, name), name=f"fsdpjob/{name}")
    elif key in _wakes:
        _wakes[key].set()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def job_event(namespace: str | None, name: str, **_: Any) -> None:
    if namespace is None:
        return
    # Also on DELETED: the loop's next pass finds no job and ends by itself. Cancelling it here
    # would race with a new job of the same name, whose ADDED event kopf may handle first
    # (it serialises events per uid, not per name), and leave that job with no loop at all.
    _poke(namespace, name)


@kopf.on.event("", "v1", "pods", labels={names.Label.JOB.value: kopf.PRESENT})
async def pod_event(body: kopf.Body, namespace: str | None, **_: Any) -> None:
    for owner in body.get("metadata", {}).get("ownerReferences") or []:
        key = (namespace or "", str(owner.get("name")))
        if owner.get("kind") == api.KIND and key in _loops:
            _poke(*key)


@kopf.on.event("", "v1", "nodes")
async def node_event(**_: Any) -> None:
    for key in list(_loops):
        _poke(*key)
