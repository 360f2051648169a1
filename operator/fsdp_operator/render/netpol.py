"""Pure templating of a job's NetworkPolicy: only the job's own pods and the operator reach the
gang's ports (torchrun's rendezvous store, the in-place keepers), every other port as before.

One policy per job, not per attempt: it selects the job's pods by the job label every attempt
and spare carries, so it is created once with the first gang (before its pods, so no pod of the
job runs a moment unguarded) and garbage-collected with the job; per attempt it would be one
more create and delete each restart for no narrower rule (the keys of an attempt are the
keeper's own layer, keeper authentication).

A policy that selects a pod isolates all its ingress, and policies only ever add. So where no
other policy isolates the job's pods, it lets every other port in from anywhere (TCP below and
above the gang's ports, all UDP): such a namespace sees only the gang's ports closed, and the
metrics port (the operator's and Prometheus' scrapes, the kubelet's probes) stays as it was.
Where the namespace's own policies already isolate the job's pods (a tenant's default deny),
that rule is left out: the policy must never open what the tenant closed, so it adds only the
gang's pods to each other and the operator to the keepers' port (`isolated`). SCTP, which no
part of a job uses, is left closed: some network plugins refuse a whole policy that names it.
Port ranges (`endPort`, Kubernetes 1.25) must be enforced by the network plugin; one that
ignores them would close every other port (docs/operations.md).
Traffic from a pod's own node (the kubelet's probes; the operator where it runs as a host
process, as in tests/integration) is always allowed by the NetworkPolicy API.

Pure: no I/O, no clock, no kopf, no kubernetes client objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from fsdp_operator.render import templates
from fsdp_operator.types import names

GANG_PORTS = (names.RENDEZVOUS_PORT, names.GANG_PORT)
"""The ports only the gang (and the operator, on the keeper's) may reach."""
OPERATOR_PORTS = (names.GANG_PORT,)
"""What the operator itself asks of a pod on the gang's ports: the keepers (spares, promote)."""
MAX_PORT = 65535


@dataclasses.dataclass(frozen=True)
class OperatorPeer:
    """Where the operator's pods are: its namespace and its pods' labels. An empty namespace:
    it does not run in a pod here (a host process), and reaches pods as node traffic."""

    namespace: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def peer(self) -> dict[str, Any] | None:
        """The NetworkPolicy peer selecting the operator's pods, or None (no pod to select)."""
        if not self.namespace:
            return None
        peer: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
        }
        peer["podSelector"] = {"matchLabels": dict(self.labels)} if self.labels else {}
        return peer


def _tcp(port: int, end: int | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"protocol": "TCP", "port": port}
    if end is not None and end != port:
        rule["endPort"] = end
    return rule


def open_ports() -> list[dict[str, Any]]:
    """Every port but the gang's: the TCP ranges around them, and all of UDP."""
    ranges, start = [], 1
    for port in sorted(GANG_PORTS):
        if port > start:
            ranges.append(_tcp(start, port - 1))
        start = port + 1
    if start <= MAX_PORT:
        ranges.append(_tcp(start, MAX_PORT))
    return [*ranges, {"protocol": "UDP"}]


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions) against a pod's labels; an empty
    selector selects every pod. An operator this code does not know selects nothing."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
        held = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(str(op), False)
        if not held:
            return False
    return True


def isolates(policy: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a NetworkPolicy isolates the ingress of a pod with these labels (it selects the
    pod, and its policyTypes include Ingress, which they do when left out)."""
    spec = policy.get("spec") or {}
    types = spec.get("policyTypes") or ["Ingress"]
    return "Ingress" in types and _matches(spec.get("podSelector") or {}, labels)


def isolated_by_others(
    job: names.JobRef, policies: Sequence[Mapping[str, Any]], labels: Mapping[str, str]
) -> bool:
    """Whether a policy of the namespace other than the job's own isolates its pods."""
    own = names.network_policy_name(job.name)
    return any(
        isolates(p, labels) for p in policies if (p.get("metadata") or {}).get("name") != own
    )


def _ingress(job: names.JobRef, operator: OperatorPeer, *, isolated: bool) -> list[dict[str, Any]]:
    gang = {"from": [{"podSelector": {"matchLabels": names.selector_labels(job.name)}}]}
    rules = [gang]  # every port: the store, the keepers, the collectives' ephemeral ports
    peer = operator.peer()
    if peer is not None:
        rules.append({"from": [peer], "ports": [_tcp(p) for p in OPERATOR_PORTS]})
    if not isolated:
        rules.append({"ports": open_ports()})  # no `from`: anyone, as without this policy
    return rules


def network_policy(
    job: names.JobRef, *, operator: OperatorPeer, isolated: bool = False
) -> dict[str, Any]:
    """The job's NetworkPolicy: its pods (all attempts, spares too) take the gang's ports
    from the job's own pods and the operator only; every other port from anywhere, unless
    the namespace's own policies already isolate them (`isolated`: nothing opened)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": names.network_policy_name(job.name),
            "namespace": job.namespace,
            "labels": {
                names.Label.APP_NAME.value: names.APP_NAME,
                names.Label.APP_INSTANCE.value: names.job_label_value(job.name),
                names.Label.APP_MANAGED_BY.value: names.MANAGER,
                **names.selector_labels(job.name),
            },
            "ownerReferences": [templates.owner_reference(job)],
        },
        "spec": {
            "podSelector": {"matchLabels": names.selector_labels(job.name)},
            "policyTypes": ["Ingress"],
            "ingress": _ingress(job, operator, isolated=isolated),
        },
    }
