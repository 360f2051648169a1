"""What fsdpctl reads from the cluster: FSDPJobs, their Events, kept evidence, the kubeconfig.

Reads only (the one write, suspend/resume, is the dispatcher's patch); the client comes from
io/kube.py's loader. Objects are returned as the API server sent them: documents.py types them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from fsdp_operator.types import api


def jobs(custom: Any, namespace: str | None) -> list[dict[str, Any]]:
    """Every FSDPJob in `namespace` (None: in every namespace)."""
    if namespace:
        resp = custom.list_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, _preload_content=False
        )
    else:
        resp = custom.list_cluster_custom_object(
            api.GROUP, api.VERSION, api.PLURAL, _preload_content=False
        )
    return list(json.loads(resp.data)["items"])


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
    resp = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    return sorted(json.loads(resp.data)["items"], key=lambda e: e.get("firstTimestamp") or "")


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
