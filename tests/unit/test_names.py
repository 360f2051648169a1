"""Names of the operator's objects: valid Kubernetes names for any FSDPJob name, stable, unique."""

from __future__ import annotations

import re

import pytest

from fsdp_operator.types import names

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

JOB = names.JobRef(name="llama", namespace="team-a", uid="3f2a1b4c-0d1e-4f00-9abc-def012345678")

# Job names the API server accepts (DNS-1123 subdomains): long, dotted, digit-first.
AWKWARD = [
    "llama",
    "7b-run",
    "llama.7b.v2",
    "a",
    "x" * 253,
    "a." * 100 + "b",
    "9" * 63,
    "run-" + "z" * 60,
]


@pytest.mark.parametrize("job_name", AWKWARD)
def test_child_names_are_valid_dns_labels_for_any_job_name(job_name: str) -> None:
    service = names.service_name(job_name)
    assert DNS_1035.match(service) and len(service) <= 63
    pod = names.pod_name(job_name, attempt=names.MAX_ATTEMPT, node_rank=names.MAX_RANK)
    assert DNS_LABEL.match(pod) and len(pod) <= 63
    value = names.job_label_value(job_name)
    assert LABEL_VALUE.match(value) and len(value) <= 63


def test_ordinary_names_pass_through_unchanged() -> None:
    assert names.service_name("llama") == "llama-workers"
    assert names.pod_name("llama", attempt=3, node_rank=1) == "llama-a3-1"
    assert names.job_label_value("llama.7b") == "llama.7b"


def test_shortened_names_stay_distinct_and_stable_across_attempts() -> None:
    long_a, long_b = "p" * 60 + "a", "p" * 60 + "b"
    assert names.job_part(long_a) != names.job_part(long_b)
    assert names.job_part("a.b") != names.job_part("a-b")
    assert names.job_label_value("q" * 70) != names.job_label_value("q" * 69 + "r")
    prefixes = {
        names.pod_name(long_a, attempt=a, node_rank=r).rsplit("-a", 1)[0]
        for a in (0, 9, 10, 123_456)
        for r in (0, 1023)
    }
    assert len(prefixes) == 1


def test_pod_names_unique_per_attempt_and_rank() -> None:
    pods = {
        names.pod_name("llama", attempt=a, node_rank=r) for a in range(1, 12) for r in range(12)
    }
    assert len(pods) == 11 * 12  # "-a1-11" and "-a11-1" must not collide


def test_pod_name_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="attempt"):
        names.pod_name("llama", attempt=names.MAX_ATTEMPT + 1, node_rank=0)
    with pytest.raises(ValueError, match="node_rank"):
        names.pod_name("llama", attempt=1, node_rank=-1)


def test_rank0_address_is_pod0_under_the_headless_service() -> None:
    assert names.rank0_address(JOB, attempt=2) == (
        "llama-a2-0.llama-workers.team-a.svc.cluster.local"
    )
    assert names.rank0_address(JOB, attempt=2, cluster_domain="k8s.example").endswith(
        ".svc.k8s.example"
    )


def test_rendezvous_id_unique_per_job_object_and_attempt() -> None:
    same_name_new_object = names.JobRef(name="llama", namespace="team-a", uid="99" + JOB.uid[2:])
    ids = {
        names.rendezvous_id(JOB, attempt=1),
        names.rendezvous_id(JOB, attempt=2),
        names.rendezvous_id(same_name_new_object, attempt=1),
    }
    assert len(ids) == 3
    assert names.rendezvous_id(JOB, attempt=1) == "3f2a1b4c0d1e-a1"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"fsdpoperator.io/attempt": "4"}, 4),
        ({"fsdpoperator.io/attempt": "0"}, 0),
        ({"fsdpoperator.io/attempt": "-1"}, None),
        ({"fsdpoperator.io/attempt": "x"}, None),
        ({"fsdpoperator.io/attempt": ""}, None),
        ({"fsdpoperator.io/attempt": "\u00b2"}, None),  # str.isdigit() would accept it
        ({}, None),
        (None, None),
    ],
)
def test_parse_attempt(labels: dict[str, str] | None, expected: int | None) -> None:
    assert names.parse_attempt(labels) == expected


def test_parse_node_rank() -> None:
    assert names.parse_node_rank({"fsdpoperator.io/node-rank": "7"}) == 7
    assert names.parse_node_rank({"fsdpoperator.io/attempt": "7"}) is None


def test_selectors() -> None:
    assert names.label_selector(names.attempt_selector_labels("llama", attempt=3)) == (
        "fsdpoperator.io/attempt=3,fsdpoperator.io/job=llama"
    )


def test_jobref_from_body() -> None:
    body = {
        "apiVersion": "fsdpoperator.io/v1alpha1",
        "kind": "FSDPJob",
        "metadata": {"name": "llama", "namespace": "team-a", "uid": JOB.uid},
    }
    assert names.JobRef.of(body) == JOB


def test_operator_keys_are_reserved() -> None:
    assert names.is_operator_key("fsdpoperator.io/anything")
    assert names.is_operator_key("app.kubernetes.io/managed-by")
    assert not names.is_operator_key("app.kubernetes.io/part-of")
    assert not names.is_operator_key("team")


def test_ports() -> None:
    assert names.RENDEZVOUS_PORT == 29500
    assert names.METRICS_PORT == 9400
