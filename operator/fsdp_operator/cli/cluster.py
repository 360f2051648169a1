"""What fsdpctl reads from the cluster: FSDPJobs, their Events, kept evidence, the kubeconfig.

Reads only (the one write, suspend/resume, is the dispatcher's patch); the client comes from
io/kube.py's loader. Objects are returned as the API server sent them: documents.py types them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import kubernetes
import kubernetes.watch
from kubernetes.client.exceptions import ApiException

from fsdp_operator.types import api


def jobs(custom: Any, namespace: str | None, selector: str | None = None) -> list[dict[str, Any]]:
    """Every FSDPJob in `namespace` (None: in every namespace) whose labels match `selector`."""
    return list(job_list(custom, namespace, selector)["items"])


def _list_call(custom: Any, namespace: str | None) -> tuple[Any, tuple[str, ...]]:
    """The client's list method for the scope, and its positional arguments."""
    if namespace:
        return custom.list_namespaced_custom_object, (api.GROUP, api.VERSION, namespace, api.PLURAL)
    return custom.list_cluster_custom_object, (api.GROUP, api.VERSION, api.PLURAL)


def job_list(custom: Any, namespace: str | None, selector: str | None = None) -> dict[str, Any]:
    """The FSDPJob list as the API server sent it: items, and the resourceVersion a watch
    starts from."""
    call, positional = _list_call(custom, namespace)
    extra = {"label_selector": selector} if selector else {}
    resp = call(*positional, _preload_content=False, **extra)
    return dict(json.loads(resp.data))


def watch(
    custom: Any,
    namespace: str | None,
    *,
    selector: str | None,
    since: str | None,
    timeout_seconds: int | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each change to the FSDPJobs in scope after resourceVersion `since`: (ADDED|MODIFIED|
    DELETED, the object). Without a timeout it runs until interrupted (the client reconnects
    when the server closes the stream)."""
    call, positional = _list_call(custom, namespace)
    extra: dict[str, Any] = {"label_selector": selector} if selector else {}
    if since:
        extra["resource_version"] = since
    if timeout_seconds is not None:
        extra["timeout_seconds"] = timeout_seconds
    for event in kubernetes.watch.Watch().stream(call, *positional, **extra):
        yield str(event["type"]), dict(event["object"])


def job(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    """One FSDPJob; the API's 404 when there is none."""
    resp = custom.get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, _preload_content=False
    )
    return dict(json.loads(resp.data))


def job_or_none(custom: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The FSDPJob, or None when there is none: a mistyped name deserves a sentence, not a trace."""
    try:
        return job(custom, namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        print(f"fsdpctl: no FSDPJob {name} in namespace {namespace}", file=sys.stderr)
        return None


def events(core: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events about the job, oldest first."""
    return sorted(event_list(core, namespace, name)["items"], key=event_time)


def event_list(core: Any, namespace: str, name: str) -> dict[str, Any]:
    """The Events about the job as the API server sent them (items, and the resourceVersion a
    watch starts from)."""
    resp = core.list_namespaced_event(
        namespace, field_selector=_about(name), _preload_content=False
    )
    return dict(json.loads(resp.data))


def event_time(event: dict[str, Any]) -> str:
    """When an Event last happened (a repeated one counts its newest), as the API writes it."""
    return str(
        event.get("lastTimestamp") or event.get("firstTimestamp") or event.get("eventTime") or ""
    )


def watch_events(
    core: Any, namespace: str, name: str, *, since: str | None, timeout_seconds: int | None = None
) -> Iterator[dict[str, Any]]:
    """Each Event about the job added or repeated after resourceVersion `since`."""
    extra: dict[str, Any] = {"field_selector": _about(name)}
    if since:
        extra["resource_version"] = since
    if timeout_seconds is not None:
        extra["timeout_seconds"] = timeout_seconds
    for change in kubernetes.watch.Watch().stream(core.list_namespaced_event, namespace, **extra):
        if change["type"] in ("ADDED", "MODIFIED"):  # the client made a V1Event of it
            yield dict(core.api_client.sanitize_for_serialization(change["object"]))


def _about(name: str) -> str:
    """The field selector of the Events about one FSDPJob (not a pod of the same name)."""
    return f"involvedObject.name={name},involvedObject.kind={api.KIND}"


def config_map_data(core: Any, namespace: str, name: str) -> dict[str, str]:
    """A ConfigMap's data; the API's 404 when there is none."""
    resp = core.read_namespaced_config_map(name, namespace, _preload_content=False)
    return dict(json.loads(resp.data).get("data") or {})


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace the kubeconfig's context names, as kubectl uses it; else 'default'."""
    try:
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")
