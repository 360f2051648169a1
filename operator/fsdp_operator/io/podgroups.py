"""A job's PodGroups (spec.gangScheduling) on the API server: read, create, delete.

Served by the gang scheduler's CRD (scheduler-plugins' or Volcano's), which a cluster may not
have: a 404 on the collection is `MissingApi`, whose message says which CRD to install. The
pass fails with it before the attempt's pods are created (a member pod without its group is
never placed), so the user sees it as a ReconcileError condition and a Warning Event, and the
next pass tries again. Writes go through the Kube's leader fence. No decisions here
(policy/podgroups.py).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from fsdp_operator.io import kube
from fsdp_operator.types import names, spec_gang

READ_TIMEOUT = kube.READ_TIMEOUT


class MissingApi(RuntimeError):
    """The cluster serves no PodGroup of the job's gang scheduler."""

    def __init__(self, kind: spec_gang.GangKind) -> None:
        where = spec_gang.API[kind]
        super().__init__(
            f"spec.gangScheduling.kind={kind}: the cluster serves no {where.kind}"
            f" {where.api_version} ({where.plural}.{where.group}): install {_WHOSE[kind]}, or"
            " remove spec.gangScheduling; the gang's pods are created once it is served"
        )


_WHOSE = {
    spec_gang.GangKind.COSCHEDULING: "scheduler-plugins' PodGroup CRD and its scheduler",
    spec_gang.GangKind.VOLCANO: "Volcano",
}


class PodGroups:
    """PodGroups of one scheduler kind, through the operator's API access."""

    def __init__(self, api_access: kube.Kube, kind: spec_gang.GangKind) -> None:
        self._kube = api_access
        self._kind = kind
        self._api = spec_gang.API[kind]

    def _args(self, namespace: str) -> tuple[str, str, str, str]:
        return self._api.group, self._api.version, namespace, self._api.plural

    def of_job(self, job: names.JobRef) -> list[dict[str, Any]]:
        """The PodGroups carrying the job's label. MissingApi: no such CRD here."""
        selector = ",".join(f"{k}={v}" for k, v in names.selector_labels(job.name).items())
        try:
            resp = self._kube.custom.list_namespaced_custom_object(
                *self._args(job.namespace),
                label_selector=selector,
                _preload_content=False,
                _request_timeout=READ_TIMEOUT,
            )
        except ApiException as exc:
            raise (MissingApi(self._kind) if exc.status == 404 else exc) from None
        return list(json.loads(resp.data).get("items") or [])

    def of_job_if_served(self, job: names.JobRef) -> list[dict[str, Any]]:
        """`of_job`, or none where the cluster does not serve this kind's CRD or the operator
        may not read it (a kind the job does not use: nothing of the operator's is there)."""
        try:
            return self.of_job(job)
        except MissingApi:
            return []
        except ApiException as exc:
            if exc.status == 403:
                return []
            raise

    def create(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """None when created; on a 409, the object that holds the name ({} if gone since)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self._kube.custom.create_namespaced_custom_object(
                *self._args(namespace), body, _request_timeout=self._kube.write_timeout()
            )
        except ApiException as exc:
            if exc.status == 404:
                raise MissingApi(self._kind) from None
            if exc.status != 409:
                raise
            return self._get(namespace, name) or {}
        return None

    def delete(self, namespace: str, name: str) -> None:
        """Delete PodGroup `name`; gone already: nothing."""
        try:
            self._kube.custom.delete_namespaced_custom_object(
                *self._args(namespace), name, _request_timeout=self._kube.write_timeout()
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp = self._kube.custom.get_namespaced_custom_object(
                *self._args(namespace), name, _preload_content=False, _request_timeout=READ_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(json.loads(resp.data))
