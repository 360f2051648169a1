"""The one module that talks to the Kubernetes API (and to rank 0's metrics endpoint).

Objects travel as plain dicts (the JSON the API serves) so templates and observations need no
client types. Every call is idempotent where the reconcile loop needs it: creating what exists
and deleting what is gone are not errors. No decisions are made here.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import struct
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.keepalive import tcp_keepalive_socket_options
from prometheus_client.parser import text_string_to_metric_families

from fsdp_operator.io import metrics
from fsdp_operator.types import api, names, queueing, scrape

log = logging.getLogger(__name__)


READ_TIMEOUT = 30.0
"""No request waits forever on a cut connection (a pass would hang in its thread)."""


class NotLeader(RuntimeError):
    """A write refused before it was sent: this replica does not (or no longer) lead."""


def load_client(
    config_file: str | None = None, *, context: str | None = None
) -> kubernetes.client.ApiClient:
    """In-cluster credentials when running in a pod, else `config_file`, $KUBECONFIG or
    ~/.kube/config (its `context`, else the current one).

    No retries inside the client, and sockets close with SO_LINGER 0 (a reset): a write given
    up on (its timeout passed while the network was cut) is neither sent again nor delivered
    late by the kernel when the link returns, perhaps after another replica took over; the
    next pass decides afresh. Every request is counted by verb and resource.
    """
    conf = kubernetes.client.Configuration()
    try:
        if config_file is not None or context is not None:
            raise kubernetes.config.ConfigException("a kubeconfig was given")
        kubernetes.config.load_incluster_config(client_configuration=conf)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(
            config_file=config_file, context=context, client_configuration=conf
        )
    conf.connection_pool_maxsize = 32  # a pass's creates and deletes go out together
    conf.retries = False  # a write given up on is never sent again, later, by urllib3
    conf.socket_options = [
        *tcp_keepalive_socket_options(),
        (socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
    ]
    client = kubernetes.client.ApiClient(conf)
    serialize = client.param_serialize  # once per request, with the path's template

    def counted(
        method: str, resource_path: str, path_params: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        metrics.API_REQUESTS.labels(*request_kind(resource_path, method, path_params)).inc()
        return serialize(method, resource_path, path_params, *args, **kwargs)

    client.param_serialize = counted
    return client


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_kind(
    resource_path: str, method: str, path_params: dict[str, Any] | None = None
) -> tuple[str, str]:
    """(verb, resource) of a client call, from its path template: a GET of a collection
    (`.../pods`) is a list, of one object (`.../pods/{name}`) a get. A custom resource's
    `{plural}` is filled in from the call's path parameters."""
    plural = str((path_params or {}).get("plural", "{plural}"))
    parts = [plural if p == "{plural}" else p for p in resource_path.split("/") if p]
    named = "{name}" in parts
    if named:
        at = parts.index("{name}")
        resource = "/".join([parts[at - 1], *parts[at + 1 :]])
    else:
        resource = parts[-1] if parts else ""
    verb = _VERBS.get(method.upper(), "get" if named else "list")
    return verb, resource


def _data(resp: Any) -> Any:
    return json.loads(resp.data)


def _ok_statuses(exc: ApiException, *codes: int) -> bool:
    return exc.status in codes


def _read(read: Callable[..., Any], *args: str) -> dict[str, Any] | None:
    """A custom object as a dict, or None when it does not exist (404)."""
    try:
        resp = read(*args, _preload_content=False, _request_timeout=READ_TIMEOUT)
    except ApiException as exc:
        if _ok_statuses(exc, 404):
            return None
        raise
    return dict(_data(resp))


class Kube:
    """Thin, typed-by-dict access to the objects an FSDPJob owns."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        write_window: Callable[[], float] | None = None,
    ) -> None:
        """`write_window`: seconds this replica may still write (leader election); 0 or less
        refuses every create, patch and delete before it is sent. None: always may."""
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.networking = kubernetes.client.NetworkingV1Api(client)
        self._window = write_window
        self._events: OrderedDict[tuple[str, ...], tuple[str, int, float]] = OrderedDict()
        self._events_lock = threading.Lock()

    def _writing(self) -> float:
        """The timeout of a write about to be sent: the time left to act, at most 30 s."""
        if self._window is None:
            return 30.0
        left = self._window()
        if left <= 0:
            metrics.FENCED.inc()
            raise NotLeader("not the leader: write refused")
        return min(30.0, left)

    def write_timeout(self) -> float:
        """The fence of a write other io modules send (podgroups.py): as `_writing`."""
        return self._writing()

    # --- the FSDPJob --------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        read = self.custom.get_namespaced_custom_object
        return _read(read, api.GROUP, api.VERSION, namespace, api.PLURAL, name)

    def get_profile(self, name: str) -> dict[str, Any] | None:
        """The FSDPRuntimeProfile `name` (cluster-scoped), or None when there is none."""
        read = self.custom.get_cluster_custom_object
        return _read(read, api.GROUP, api.VERSION, api.PROFILE_PLURAL, name)

    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Kueue's Workload `name` (a queued job's pod group), or None where there is none, or
        Kueue is not installed (404), or the operator may not read it (403: the reason is then
        missing from the job's status, nothing else)."""
        group, version, plural = queueing.WORKLOAD_API
        try:
            return _read(
                self.custom.get_namespaced_custom_object, group, version, namespace, plural, name
            )
        except ApiException as exc:
            if _ok_statuses(exc, 403):
                log.warning("cannot read Kueue Workload %s/%s: %s", namespace, name, exc.reason)
                return None
            raise

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PersistentVolumeClaim `name`, or None where there is none (404). {} where the
        operator may not read it (403, a chart older than the rule): not known, not missing."""
        try:
            return _read(self.core.read_namespaced_persistent_volume_claim, name, namespace)
        except ApiException as exc:
            if _ok_statuses(exc, 403):
                log.warning(
                    "cannot read PersistentVolumeClaim %s/%s: %s", namespace, name, exc.reason
                )
                return {}
            raise

    def delete_workload(self, namespace: str, name: str) -> None:
        """Delete Kueue's Workload `name`: a pod group the job left (resized, suspended, failed)
        releases its quota, and Kueue lets its pods go. Gone already, or no Kueue: nothing."""
        group, version, plural = queueing.WORKLOAD_API
        try:
            self.custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self._writing()
            )
        except ApiException as exc:
            if not _ok_statuses(exc, 404):
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        """One merge patch of the whole status (None values clear fields); returns the job's
        resourceVersion after it."""
        done = self.custom.patch_namespaced_custom_object_status(
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            name,
            {"status": status},
            _request_timeout=self._writing(),
        )
        return str((done or {}).get("metadata", {}).get("resourceVersion", ""))

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                api.GROUP,
                api.VERSION,
                namespace,
                api.PLURAL,
                name,
                propagation_policy="Background",
                _request_timeout=self._writing(),
            )
        except ApiException as exc:
            if not _ok_statuses(exc, 404):
                raise

    # --- pods, service ------------------------------------------------------------------------
    def create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Pod, Service, NetworkPolicy or Secret. None when created; on a 409, the
        object that holds the name (a Secret's: {}, the operator may not read it).

        The caller decides whether that object is its own (by controller uid): a name is never
        proof of ownership.
        """
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        timeout = self._writing()
        create = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "Secret": self.core.create_namespaced_secret,
        }[body["kind"]]
        try:
            create(ns, body, _request_timeout=timeout)
        except ApiException as exc:
            if not _ok_statuses(exc, 409):
                raise
            if body["kind"] == "Secret":
                return {}  # the operator may not read Secrets in a job's namespace
            return self.get(body["kind"], ns, name) or {}
        return None

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Pod, Service or NetworkPolicy as a dict (with its kind), or None when it does not
        exist."""
        read = {
            "Pod": self.core.read_namespaced_pod,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
        }.get(kind, self.core.read_namespaced_service)
        try:
            found = dict(
                _data(read(name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT))
            )
        except ApiException as exc:
            if _ok_statuses(exc, 404):
                return None
            raise
        return {**found, "kind": kind}

    def network_policies(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's NetworkPolicies as dicts (whether its own isolate a job's pods)."""
        found = self.networking.list_namespaced_network_policy(
            namespace, _preload_content=False, _request_timeout=READ_TIMEOUT
        )
        return list(_data(found).get("items") or [])

    def patch_network_policy_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        """Replace a NetworkPolicy's spec (merge patch: the lists in it are replaced whole)."""
        self.networking.patch_namespaced_network_policy(
            name, namespace, {"spec": spec}, _request_timeout=self._writing()
        )

    def dry_run_pod(self, body: dict[str, Any]) -> tuple[int, str] | None:
        """Server-side dry run of a pod create (all admission, nothing stored).

        None when the API server would admit it; else (HTTP status, the server's message).
        """
        try:
            self.core.create_namespaced_pod(
                body["metadata"]["namespace"], body, dry_run="All", _request_timeout=READ_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 409:  # only the name is taken: everything before it passed
                return None
            try:
                message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
            except ValueError:
                message = str(exc.reason)
            return int(exc.status or 0), message
        return None

    def label_pod(self, namespace: str, name: str, labels: dict[str, str | None]) -> None:
        """Merge `labels` into a pod's (None removes one)."""
        self.core.patch_namespaced_pod(
            name, namespace, {"metadata": {"labels": labels}}, _request_timeout=self._writing()
        )

    def delete_pod(self, namespace: str, name: str, *, grace: int | None) -> None:
        """Delete with `grace` seconds (0 forces; None keeps the pod's own period)."""
        timeout = self._writing()
        try:
            self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=grace, _request_timeout=timeout
            )
        except ApiException as exc:
            if not _ok_statuses(exc, 404):
                raise

    def pod_log_tail(self, namespace: str, name: str, *, lines: int, limit: int) -> str | None:
        """The last `lines` lines of the pod's worker container (at most `limit` bytes, the
        newest kept); None when the pod or its log is gone."""
        try:
            resp = self.core.read_namespaced_pod_log(
                name,
                namespace,
                container=names.CONTAINER_NAME,
                tail_lines=lines,
                _preload_content=False,
                _request_timeout=READ_TIMEOUT,
            )
        except ApiException as exc:
            if _ok_statuses(exc, 400, 404):  # gone, or a container that never started
                return None
            raise
        data: bytes = resp.data
        return data[-limit:].decode(errors="replace")

    def put_config_map(self, body: dict[str, Any], *, owner_uid: str) -> bool:
        """Create the ConfigMap, or replace the one of that name if `owner_uid` controls it (a
        pass done again). False: the name is someone else's, left as it is."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        timeout = self._writing()
        try:
            self.core.create_namespaced_config_map(ns, body, _request_timeout=timeout)
            return True
        except ApiException as exc:
            if not _ok_statuses(exc, 409):
                raise
        found = self._own_config_map(ns, name, owner_uid)
        if found is None:
            return False
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": found[0]}}
        self.core.replace_namespaced_config_map(name, ns, body, _request_timeout=self._writing())
        return True

    def delete_config_map(self, namespace: str, name: str, *, owner_uid: str) -> None:
        """Delete it if `owner_uid` controls it (the uid is a precondition of the delete)."""
        found = self._own_config_map(namespace, name, owner_uid)
        if found is None:
            return
        try:
            self.core.delete_namespaced_config_map(
                name,
                namespace,
                body=kubernetes.client.V1DeleteOptions(
                    preconditions=kubernetes.client.V1Preconditions(uid=found[1])
                ),
                _request_timeout=self._writing(),
            )
        except ApiException as exc:
            if not _ok_statuses(exc, 404, 409):
                raise

    def _own_config_map(self, namespace: str, name: str, owner_uid: str) -> tuple[str, str] | None:
        """(resourceVersion, uid) of the ConfigMap if `owner_uid` is its controller."""
        try:
            found = _data(
                self.core.read_namespaced_config_map(
                    name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT
                )
            )
        except ApiException as exc:
            if _ok_statuses(exc, 404):
                return None
            raise
        meta = found.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        if not any(o.get("uid") == owner_uid and o.get("controller") for o in owners):
            return None
        return str(meta.get("resourceVersion", "")), str(meta.get("uid", ""))

    # --- events ---------------------------------------------------------------------------------
    EVENT_SERIES_SECONDS = 600.0
    """The same Event (object, type, reason, message) again within this window raises the
    existing one's count and lastTimestamp, as client-go's recorder does, instead of adding
    one more object."""

    def event(self, job: names.JobRef, *, type_: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        message = message[:1024]
        key = (job.namespace, job.uid, type_, reason, message)
        with self._events_lock:
            seen = self._events.get(key)
        try:
            if seen is not None and time.monotonic() - seen[2] < self.EVENT_SERIES_SECONDS:
                name, count = seen[0], seen[1] + 1
                patch = {"count": count, "lastTimestamp": now.isoformat()}
                try:
                    self.core.patch_namespaced_event(
                        name, job.namespace, patch, _request_timeout=self._writing()
                    )
                    with self._events_lock:
                        self._events[key] = (name, count, seen[2])
                    return
                except ApiException as exc:
                    if not _ok_statuses(exc, 404):  # gone (its TTL passed): post a new one
                        raise
            name = self._post_event(job, type_=type_, reason=reason, message=message, now=now)
        except ApiException as exc:  # an Event is advice; never fail a pass for one
            log.warning("event %s for %s not posted: %s", reason, job.name, exc.reason)
            return
        with self._events_lock:
            self._events[key] = (name, 1, time.monotonic())
            self._events.move_to_end(key)
            while len(self._events) > 4096:
                self._events.popitem(last=False)

    def _post_event(
        self,
        job: names.JobRef,
        *,
        type_: str,
        reason: str,
        message: str,
        now: datetime.datetime,
    ) -> str:
        name = f"{job.name}.{uuid.uuid4().hex[:12]}"
        body = {
            "metadata": {"name": name, "namespace": job.namespace},
            "involvedObject": {
                "apiVersion": job.api_version,
                "kind": job.kind,
                "name": job.name,
                "namespace": job.namespace,
                "uid": job.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": names.MANAGER},
            "reportingComponent": names.MANAGER,
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        self.core.create_namespaced_event(job.namespace, body, _request_timeout=self._writing())
        return name


def describe_error(exc: Exception) -> str:
    """One line for a user: an API error's status and message, not its HTTP headers."""
    if isinstance(exc, ApiException) and exc.body:
        try:
            said = json.loads(exc.body).get("message")
        except ValueError:
            said = None
        return f"API error {exc.status}: {said or exc.reason}"[:1024]
    return f"{type(exc).__name__}: {exc}"[:1024]


def contract_samples(text: str) -> scrape.Scrape:
    """The samples of the contract's metrics in a Prometheus text page, each with its name and
    labels. Other metrics (a user's, the runtime's) and garbage are ignored."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:  # not Prometheus text: nothing known
        return scrape.Scrape()
    return scrape.Scrape(
        scrape.Sample(sample.name, scrape.labels_of(sample.labels), sample.value)
        for family in families
        for sample in family.samples
        if sample.name.startswith(_CONTRACT_PREFIXES)
    )


_CONTRACT_PREFIXES = ("fsdp_train_", "fsdp_checkpoint_", "fsdp_worker_", "fsdp_slow_rank")
