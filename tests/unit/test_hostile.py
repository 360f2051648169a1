"""The hostile-spec table against the operator's own check (the same model the CRD comes from).

Every case stopped at admission or by the operator's templating is refused here, naming the
field; the cases only the API server can judge (its dry run) pass this check, by design. The
same table runs against the real API server and operator in tests/integration/test_security.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from fsdp_operator.run import specs
from fsdp_operator.types import api, names
from tests import hostile_specs as hs

JOB = names.JobRef(name="hostile", namespace="team-a", uid="00000000-0000-0000-0000-000000000001")


PROFILE = api.RuntimeProfileSpec.model_validate({**hs.PROFILE_SPEC, "namespaces": ["team-a"]})


def _check(case: hs.Case) -> str:
    job = JOB if case.listed else dataclasses.replace(JOB, namespace="team-b")
    body = {
        "metadata": {"name": job.name, "namespace": job.namespace, "uid": job.uid},
        "spec": hs.spec_of(case),
    }
    return specs.check_spec(body, job, {hs.PROFILE: PROFILE}.get)[1]


def test_the_base_spec_is_fine() -> None:
    assert _check(hs.Case("base", hs.Where.ADMISSION, "", lambda doc: None)) == ""


def test_there_are_at_least_thirty_cases_with_unique_ids() -> None:
    ids = [case.id for case in hs.CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", [c for c in hs.CASES if not c.dry_run_only], ids=lambda c: c.id)
def test_operator_check_refuses_naming_the_field(case: hs.Case) -> None:
    error = _check(case)
    assert error, f"{case.id} was accepted"
    assert case.field in error, error
    assert case.value in error, error


@pytest.mark.parametrize("case", [c for c in hs.CASES if c.dry_run_only], ids=lambda c: c.id)
def test_only_the_api_server_knows(case: hs.Case) -> None:
    assert _check(case) == ""


def test_the_profile_cases_start_from_a_spec_the_profile_allows() -> None:
    assert (
        _check(hs.Case("profile-base", hs.Where.ADMISSION, "", lambda d: None, profile=True)) == ""
    )


def test_a_team_pod_with_every_part_allowed_is_fine() -> None:
    """The restricted parts a team may set, together, pass (the hostile cases refuse the rest)."""

    def allowed(doc: dict[str, object]) -> None:
        pod = doc["template"]["spec"]  # type: ignore[index]
        pod.update(  # type: ignore[union-attr]
            {
                "securityContext": {"runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 3000},
                "envFrom": [{"configMapRef": {"name": "team-env"}, "prefix": "TEAM_"}],
                "imagePullSecrets": [{"name": "team-registry"}],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
                ],
                "initContainers": [
                    {
                        "name": "log-shipper",
                        "image": "fluent/fluent-bit:3",
                        "restartPolicy": "Always",
                        "securityContext": {
                            "runAsUser": 4000,
                            "readOnlyRootFilesystem": False,
                            "capabilities": {"add": ["NET_BIND_SERVICE"]},
                        },
                    }
                ],
            }
        )
        doc["resources"] = {"claims": [{"name": "gpus"}]}

    assert _check(hs.Case("team-pod", hs.Where.ADMISSION, "", allowed)) == ""
