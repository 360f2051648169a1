"""The job's NetworkPolicy (render/netpol.py): who reaches which port of the job's pods.

Judged by a small NetworkPolicy evaluator (the API's ingress semantics: a peer passes a rule
when it matches one of its `from` entries, or the rule has none; a port when it matches one of
its `ports`, or the rule has none), so each row says what a connection would meet.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from fsdp_operator.io import gang
from fsdp_operator.policy import decide
from fsdp_operator.render import netpol, templates
from fsdp_operator.run import objects, settings
from fsdp_operator.types import names
from tests import builders

JOB = builders.TYPICAL_JOB
OPERATOR = netpol.OperatorPeer(
    namespace="fsdp-system",
    labels={"app.kubernetes.io/name": "fsdp-operator", "app.kubernetes.io/instance": "fsdp"},
)
GOLDEN = pathlib.Path(__file__).parent / "golden" / "networkpolicy.yaml"


@dataclasses.dataclass(frozen=True)
class Peer:
    """Where a connection comes from: a pod (its namespace and labels)."""

    namespace: str
    labels: Mapping[str, str]


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all this module renders
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(entry: Mapping[str, Any], peer: Peer, policy_ns: str) -> bool:
    namespace_labels = {"kubernetes.io/metadata.name": peer.namespace}
    if "namespaceSelector" in entry:
        if not _selects(entry["namespaceSelector"], namespace_labels):
            return False
    elif peer.namespace != policy_ns:
        return False
    return _selects(entry.get("podSelector", {}), peer.labels)


def _port_matches(entry: Mapping[str, Any], port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True
    return bool(entry["port"] <= port <= entry.get("endPort", entry["port"]))


def admits(policy: Mapping[str, Any], peer: Peer, port: int, protocol: str = "TCP") -> bool:
    """Whether `policy` lets `peer` in on `port` of a pod it selects."""
    ns = policy["metadata"]["namespace"]
    for rule in policy["spec"]["ingress"]:
        peers = rule.get("from")
        if peers and not any(_peer_matches(p, peer, ns) for p in peers):
            continue
        ports = rule.get("ports")
        if not ports or any(_port_matches(p, port, protocol) for p in ports):
            return True
    return False


def _pods(job: names.JobRef) -> list[dict[str, Any]]:
    spec = builders.typical_spec(failurePolicy={"inPlaceRestarts": 3}, spares=1)
    launch = decide.Launch(attempt=2, replicas=4, resume_path="")
    gang = templates.worker_pods(job, spec, launch)
    return [*gang, templates.spare_pod(job, spec, launch, index=0)]


POLICY = netpol.network_policy(JOB, operator=OPERATOR)
OWN_POD = Peer(JOB.namespace, _pods(JOB)[1]["metadata"]["labels"])
OTHER = names.JobRef(name="llama-2", namespace=JOB.namespace, uid="u2")
NEIGHBOUR = Peer(JOB.namespace, _pods(OTHER)[0]["metadata"]["labels"])
STRANGER = Peer("team-b", {"app": "curious"})
OPERATOR_POD = Peer("fsdp-system", {**OPERATOR.labels, "pod-template-hash": "abc"})
OTHER_SYSTEM_POD = Peer("fsdp-system", {"app": "something-else"})
STORE, KEEPER, METRICS = names.RENDEZVOUS_PORT, names.GANG_PORT, names.METRICS_PORT


def test_it_selects_every_pod_of_the_job_and_no_other() -> None:
    selector = POLICY["spec"]["podSelector"]
    assert all(_selects(selector, p["metadata"]["labels"]) for p in _pods(JOB))  # spares too
    assert not any(_selects(selector, p["metadata"]["labels"]) for p in _pods(OTHER))
    assert POLICY["metadata"]["namespace"] == JOB.namespace
    assert POLICY["spec"]["policyTypes"] == ["Ingress"]  # egress is left as it was


@pytest.mark.parametrize(
    ("peer", "port", "allowed"),
    [
        (OWN_POD, STORE, True),
        (OWN_POD, KEEPER, True),
        (OWN_POD, 40123, True),  # the collectives' ephemeral ports
        (OPERATOR_POD, KEEPER, True),  # spares' takeover, promote/follow
        (OPERATOR_POD, STORE, False),  # the operator never speaks to the store
        (NEIGHBOUR, STORE, False),  # another job's pod in the same namespace
        (NEIGHBOUR, KEEPER, False),
        (STRANGER, STORE, False),  # a pod of another namespace
        (STRANGER, KEEPER, False),
        (OTHER_SYSTEM_POD, KEEPER, False),  # not the operator, though in its namespace
        (STRANGER, METRICS, True),  # Prometheus and the operator's scrape, as before
        (NEIGHBOUR, METRICS, True),
        (STRANGER, 1, True),
        (STRANGER, STORE - 1, True),
        (STRANGER, KEEPER + 1, True),
        (STRANGER, 65535, True),
    ],
)
def test_only_the_jobs_pods_and_the_operator_reach_the_gangs_ports(
    peer: Peer, port: int, allowed: bool
) -> None:
    assert admits(POLICY, peer, port) is allowed


def test_udp_stays_open_and_the_gang_ports_are_closed_to_strangers_on_tcp_only() -> None:
    assert admits(POLICY, STRANGER, 53, "UDP") and admits(POLICY, STRANGER, KEEPER, "UDP")


def test_an_operator_outside_any_pod_gets_no_rule_of_its_own() -> None:
    """A host process (tests/integration) reaches pods as node traffic, which NetworkPolicies
    never block; no namespace of the operator is let in then."""
    policy = netpol.network_policy(JOB, operator=netpol.OperatorPeer())
    assert not admits(policy, OPERATOR_POD, KEEPER)
    assert admits(policy, OWN_POD, KEEPER) and admits(policy, STRANGER, METRICS)
    assert not any("namespaceSelector" in str(rule) for rule in policy["spec"]["ingress"])


def test_an_operator_namespace_without_labels_lets_its_every_pod_in() -> None:
    policy = netpol.network_policy(JOB, operator=netpol.OperatorPeer(namespace="fsdp-system"))
    assert admits(policy, OTHER_SYSTEM_POD, KEEPER) and not admits(policy, STRANGER, KEEPER)


@pytest.mark.parametrize(
    "name", ["a" * 253, "9lives.v2", "x" * 63 + ".more", "llama"], ids=["253", "dots", "64", "ok"]
)
def test_long_or_dotted_job_names_get_a_valid_name_and_select_their_pods(name: str) -> None:
    job = dataclasses.replace(JOB, name=name)
    policy = netpol.network_policy(job, operator=OPERATOR)
    assert len(policy["metadata"]["name"]) <= names.DNS_LABEL_MAX
    assert all(_selects(policy["spec"]["podSelector"], p["metadata"]["labels"]) for p in _pods(job))
    for value in policy["metadata"]["labels"].values():
        assert len(value) <= names.DNS_LABEL_MAX


def test_the_job_owns_it_so_deleting_the_job_deletes_it() -> None:
    (owner,) = POLICY["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["controller"]) == (JOB.uid, True)


def test_the_template_labels_a_user_sets_cannot_widen_it() -> None:
    """TYPICAL's template labels try `fsdpoperator.io/job: hijack`: the pods drop it, so a
    policy of a job named `hijack` selects none of them."""
    hijack = netpol.network_policy(dataclasses.replace(JOB, name="hijack"), operator=OPERATOR)
    assert not any(
        _selects(hijack["spec"]["podSelector"], p["metadata"]["labels"]) for p in _pods(JOB)
    )


def test_golden() -> None:
    """What a reviewer reads of the object the cluster gets (UPDATE_GOLDEN=1 rewrites it)."""
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    assert yaml.safe_load(GOLDEN.read_text()) == POLICY


# --- the switch: created with the gang, or not at all -------------------------------------------
class RecordingKube:
    """Stands in for kube.Kube: records the objects created."""

    def __init__(self, policies: list[dict[str, Any]] | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.policies = policies or []

    def create(self, body: dict[str, Any]) -> None:
        self.created.append(body)

    def network_policies(self, namespace: str) -> list[dict[str, Any]]:
        return self.policies


def _launch(
    config: settings.Settings, policies: list[dict[str, Any]] | None = None
) -> RecordingKube:
    kube = RecordingKube(policies)
    spec = builders.typical_spec(replicas=2, minReplicas=1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # one: the creates stay in order
        writer = objects.ObjectWriter(
            kube,  # type: ignore[arg-type]
            config,
            pool=pool,
            gang_times=objects.GangTimes(lambda: 0.0),
            gang_client=gang.GangClient(None),
        )
        launch = decide.Launch(attempt=1, replicas=2, resume_path="")
        writer._create_gang(JOB, spec, launch, None)
    return kube


def _launch_kinds(config: settings.Settings) -> list[str]:
    return [body["kind"] for body in _launch(config).created]


def _tenant_policy(selector: dict[str, Any], types: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector}
    if types is not None:
        spec["policyTypes"] = types
    return {"metadata": {"name": "tenant"}, "spec": spec}


def _opened(kube: RecordingKube) -> bool:
    """Whether the job's policy lets every other port in from anyone (a rule with no `from`)."""
    policy = next(b for b in kube.created if b["kind"] == "NetworkPolicy")
    return any("from" not in rule for rule in policy["spec"]["ingress"])


@pytest.mark.parametrize(
    ("tenant", "opened"),
    [
        pytest.param([], True, id="no-policy-of-the-namespace"),
        pytest.param([_tenant_policy({})], False, id="default-deny"),
        pytest.param([_tenant_policy({}, ["Egress"])], True, id="egress-only-deny"),
        pytest.param(
            [_tenant_policy({"matchLabels": {"app": "db"}})], True, id="selects-other-pods"
        ),
        pytest.param(
            [
                _tenant_policy(
                    {"matchExpressions": [{"key": names.Label.JOB.value, "operator": "Exists"}]}
                )
            ],
            False,
            id="selects-every-job-pod",
        ),
        pytest.param(
            [
                _tenant_policy(
                    {
                        "matchExpressions": [
                            {
                                "key": names.Label.JOB.value,
                                "operator": "NotIn",
                                "values": [JOB.name],
                            }
                        ]
                    }
                )
            ],
            True,
            id="selects-other-jobs",
        ),
    ],
)
def test_a_namespace_its_tenant_closed_is_never_opened(
    tenant: list[dict[str, Any]], opened: bool
) -> None:
    """Policies only add: where the namespace's own policies already isolate the job's pods
    (a default deny), the job's policy lets in only the gang and the operator, so the metrics
    port stays as closed as the tenant made it; elsewhere every non-gang port stays open."""
    assert _opened(_launch(settings.Settings(), tenant)) is opened


def test_the_policy_goes_out_after_the_service_and_before_any_pod() -> None:
    assert _launch_kinds(settings.Settings()) == ["Service", "NetworkPolicy", "Pod", "Pod"]


def test_switched_off_there_is_no_policy() -> None:
    off = settings.Settings.from_env({"FSDPOP_NETWORK_POLICY": "0"})
    assert _launch_kinds(off) == ["Service", "Pod", "Pod"]


def test_the_operator_is_found_by_the_settings_the_chart_sets() -> None:
    env = {
        "FSDPOP_OPERATOR_NAMESPACE": "fsdp-system",
        "FSDPOP_OPERATOR_POD_LABELS": "app.kubernetes.io/name=fsdp-operator,"
        "app.kubernetes.io/instance=fsdp",
    }
    config = settings.Settings.from_env(env)
    assert config.network_policy  # on by default
    peer = netpol.OperatorPeer(config.operator_namespace, config.operator_pod_labels)
    assert netpol.network_policy(JOB, operator=peer) == POLICY


def test_labels_that_do_not_read_stop_the_start_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="FSDPOP_OPERATOR_POD_LABELS"):
        settings.Settings.from_env({"FSDPOP_OPERATOR_POD_LABELS": "no-equals-sign"})
