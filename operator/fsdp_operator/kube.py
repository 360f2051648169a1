"""The one module that talks to the Kubernetes API (and to rank 0's metrics endpoint).

Objects travel as plain dicts (the JSON the API serves) so templates and observations need no
client types. Every call is idempotent where the reconcile loop needs it: creating what exists
and deleting what is gone are not errors. No decisions are made here.
"""

from __future__ import annotations

import datetime
import json
import logging
import urllib.error
import urllib.request
import uuid
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from fsdp_operator import names
from fsdp_operator import spec as api

log = logging.getLogger(__name__)


def load_client() -> kubernetes.client.ApiClient:
    """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def _data(resp: Any) -> Any:
    return json.loads(resp.data)


def _ok_statuses(exc: ApiException, *codes: int) -> bool:
    return exc.status in codes


class Kube:
    """Thin, typed-by-dict access to the objects an FSDPJob owns."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    # --- the FSDPJob --------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp = self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, _preload_content=False
            )
        except ApiException as exc:
            if _ok_statuses(exc, 404):
                return None
            raise
        return dict(_data(resp))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """One merge patch of the whole status (None values clear fields)."""
        self.custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status}
        )

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name, propagation_policy="Background"
            )
        except ApiException as exc:
            if not _ok_statuses(exc, 404):
                raise

    # --- pods, nodes, service -----------------------------------------------------------------
    def list_job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        selector = names.label_selector(names.selector_labels(job_name))
        resp = self.core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        return list(_data(resp)["items"])

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(_data(self.core.list_node(_preload_content=False))["items"])

    def list_active_pods(self) -> list[dict[str, Any]]:
        """Every pod that holds node resources (for the capacity estimate)."""
        resp = self.core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False
        )
        return list(_data(resp)["items"])

    def create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Pod or Service. None when created; on a 409, the object that holds the name.

        The caller decides whether that object is its own (by controller uid): a name is never
        proof of ownership.
        """
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            if body["kind"] == "Pod":
                self.core.create_namespaced_pod(ns, body)
            else:
                self.core.create_namespaced_service(ns, body)
        except ApiException as exc:
            if not _ok_statuses(exc, 409):
                raise
            return self.get(body["kind"], ns, name) or {}
        return None

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Pod or Service as a dict (with its kind), or None when it does not exist."""
        read = self.core.read_namespaced_pod if kind == "Pod" else self.core.read_namespaced_service
        try:
            found = dict(_data(read(name, namespace, _preload_content=False)))
        except ApiException as exc:
            if _ok_statuses(exc, 404):
                return None
            raise
        return {**found, "kind": kind}

    def dry_run_pod(self, body: dict[str, Any]) -> tuple[int, str] | None:
        """Server-side dry run of a pod create (all admission, nothing stored).

        None when the API server would admit it; else (HTTP status, the server's message).
        """
        try:
            self.core.create_namespaced_pod(body["metadata"]["namespace"], body, dry_run="All")
        except ApiException as exc:
            if exc.status == 409:  # only the name is taken: everything before it passed
                return None
            try:
                message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
            except ValueError:
                message = str(exc.reason)
            return int(exc.status or 0), message
        return None

    def delete_pod(self, namespace: str, name: str, *, grace: int | None) -> None:
        """Delete with `grace` seconds (0 forces; None keeps the pod's own period)."""
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace)
        except ApiException as exc:
            if not _ok_statuses(exc, 404):
                raise

    # --- events ---------------------------------------------------------------------------------
    def event(self, job: names.JobRef, *, type_: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        body = {
            "metadata": {"name": f"{job.name}.{uuid.uuid4().hex[:12]}", "namespace": job.namespace},
            "involvedObject": {
                "apiVersion": job.api_version,
                "kind": job.kind,
                "name": job.name,
                "namespace": job.namespace,
                "uid": job.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": names.MANAGER},
            "reportingComponent": names.MANAGER,
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(job.namespace, body)
        except ApiException as exc:  # an Event is advice; never fail a pass for one
            log.warning("event %s for %s not posted: %s", reason, job.name, exc.reason)


def describe_error(exc: Exception) -> str:
    """One line for a user: an API error's status and message, not its HTTP headers."""
    if isinstance(exc, ApiException) and exc.body:
        try:
            said = json.loads(exc.body).get("message")
        except ValueError:
            said = None
        return f"API error {exc.status}: {said or exc.reason}"[:1024]
    return f"{type(exc).__name__}: {exc}"[:1024]


def scrape_metrics(ip: str, *, timeout: float) -> dict[str, float] | None:
    """Rank 0's samples of the contract's metrics, keyed `name` or `name{label=value}`;
    None when unreachable. Other metrics (a user's, the runtime's) are ignored."""
    url = f"http://{ip}:{names.METRICS_PORT}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http to a pod IP)
            text = resp.read(1 << 20).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, TimeoutError):
        return None
    values: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:  # not Prometheus text: nothing known
        return values
    for family in families:
        for sample in family.samples:
            if not sample.name.startswith(_CONTRACT_PREFIXES):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


_CONTRACT_PREFIXES = ("fsdp_train_", "fsdp_checkpoint_", "fsdp_worker_")
