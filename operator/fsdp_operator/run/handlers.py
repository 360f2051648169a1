"""Thin kopf wiring: watches fill the caches; one level-triggered reconcile loop per FSDPJob.

Why not kopf daemons or on.create/on.update: daemons put a finalizer on every job (a job could
not be deleted while the operator is down), and change handlers keep state in annotations. Here
kopf's event handlers only start, wake and stop a loop; all state is in the job's status and
its pods' labels, so any pass can be repeated after a crash. No decisions are made here, and
nothing is kept here: the process's state is one manager.Manager, made at start-up and kept in
kopf's memo (every handler gets it; a resource's memo is a copy of the operator's).

What a pass observes of pods and nodes comes from kopf's in-memory indices (cache.py says why
those), copied into a `cache.View` on the event loop before the pass goes to its thread: a pass
lists nothing. manager.py says who is woken by what.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from typing import Any

import kopf

from fsdp_operator.io import cache, metrics, observe
from fsdp_operator.run import manager, settings
from fsdp_operator.types import api, names

log = logging.getLogger(__name__)
Key = tuple[str, str]


def _manager(memo: Any) -> manager.Manager:
    found = memo.get("manager") if isinstance(memo, dict) else getattr(memo, "manager", None)
    if not isinstance(found, manager.Manager):
        raise RuntimeError("no manager in kopf's memo: the startup handler has not run")
    return found


# --- the caches: kopf indices (no handler runs before all are filled from their listings) ------
@kopf.index("", "v1", "pods", labels={names.Label.JOB.value: kopf.PRESENT})
async def fsdp_job_pods(body: kopf.Body, namespace: str | None, **_: Any) -> dict[Key, Any]:
    labels = body.get("metadata", {}).get("labels") or {}
    return {(namespace or "", labels[names.Label.JOB.value]): cache.slim_pod(body)}


@kopf.index("", "v1", "pods")
async def fsdp_pod_usage(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Feeds the store's usage table (an index function: kopf runs it for every listed pod
    before any handler); the kopf index itself stays empty."""
    used = cache.usage(body)
    uid = str(body.get("metadata", {}).get("uid", ""))
    _manager(memo).store.usage.put(uid, None if used is None else (used[0], used[2]))
    return {}


@kopf.on.event("", "v1", "pods", when=lambda type, **_: type == "DELETED")
async def pod_gone(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _manager(memo).store.usage.put(str(body.get("metadata", {}).get("uid", "")), None)


@kopf.index("", "v1", "nodes")
async def fsdp_nodes(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Keeps the store's record of each node (an index function: kopf runs it for every listed
    node before any handler); the kopf index itself stays empty, as fsdp_pod_usage's."""
    _manager(memo).node_seen(observe.node_record(body))
    return {}


@kopf.on.event("", "v1", "nodes", when=lambda type, **_: type == "DELETED")
async def node_gone(name: str, memo: kopf.Memo, **_: Any) -> None:
    _manager(memo).store.node_gone(name)


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
async def fsdp_jobs(namespace: str | None, name: str, **_: Any) -> dict[Key, bool]:
    return {(namespace or "", name): True}


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


def _lease_namespace(conf: settings.Settings) -> str:
    if conf.lease_namespace:
        return conf.lease_namespace
    sa = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError), open(sa) as f:
        return f.read().strip()
    return "default"


@kopf.on.startup()
async def startup(memo: kopf.Memo, **kwargs: Any) -> None:
    conf = settings.Settings.from_env()
    kopf_settings: kopf.OperatorSettings = kwargs["settings"]
    # A watch that dies silently (no error, no events) is re-opened within these bounds.
    kopf_settings.watching.server_timeout = conf.watch_server_timeout
    kopf_settings.watching.client_timeout = conf.watch_client_timeout
    kopf_settings.watching.connect_timeout = 10
    kopf_settings.posting.level = logging.WARNING  # our own Events say what happened
    kopf_settings.persistence.finalizer = f"{api.GROUP}/kopf-finalizer"  # unused: no such handler
    kopf_settings.persistence.diffbase_storage = NoDiffBase()
    made = manager.Manager.build(conf, identity=_identity(), lease_namespace=_lease_namespace(conf))
    made.store.pods = kwargs["fsdp_job_pods"]
    made.jobs = kwargs["fsdp_jobs"]
    memo.manager = made
    made.start()
    if conf.metrics_port:
        metrics.serve(
            conf.metrics_port,
            certfile=conf.metrics_cert_file,
            keyfile=conf.metrics_key_file,
            client_cafile=conf.metrics_client_ca_file,
        )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await _manager(memo).stop()


@kopf.on.probe(id="loops")
def loops_probe(memo: kopf.Memo, **_: Any) -> int:
    return _manager(memo).loops.running()


@kopf.on.probe(id="leader")
def leader_probe(memo: kopf.Memo, **_: Any) -> bool:
    return _manager(memo).leading()


# --- events that wake loops --------------------------------------------------------------------
@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def job_event(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    type: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    if namespace is None:
        return
    version = body.get("metadata", {}).get("resourceVersion")
    _manager(memo).job_event(namespace, name, type_=type, version=version)


@kopf.on.event("", "v1", "pods", labels={names.Label.JOB.value: kopf.PRESENT})
async def pod_event(body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    owners = body.get("metadata", {}).get("ownerReferences") or []
    _manager(memo).pod_event(namespace or "", owners)
