"""spec.gangScheduling without a cluster: the PodGroup each attempt gets (Coscheduling and
Volcano), the keys and scheduler its pods carry (spares outside the gang), the errors a user
reads for a wrong spec, when a PodGroup is kept, replaced or deleted, and the operator's RBAC
for PodGroups in the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from fsdp_operator.policy import decide
from fsdp_operator.policy import podgroups as plan_of
from fsdp_operator.render import podgroup, templates
from fsdp_operator.types import api, names, spec_gang
from tests.builders import TYPICAL_JOB, typical_spec

CHART = Path(__file__).resolve().parents[2] / "charts" / "fsdp-operator"
COSCHEDULING = {"kind": "Coscheduling", "scheduleTimeoutSeconds": 90}
VOLCANO = {"kind": "Volcano", "queue": "research"}
GROUP_A3 = names.pod_group(TYPICAL_JOB.name, attempt=3)


def launch(replicas: int = 4, attempt: int = 3) -> decide.Launch:
    return decide.Launch(attempt=attempt, replicas=replicas, resume_path="")


def gang_spec(gang: dict[str, Any] | None, **changes: Any) -> api.FSDPJobSpec:
    """TYPICAL with in-place restarts (so spares may be asked) and `gang` as gangScheduling."""
    policy = {"inPlaceRestarts": 2, "pendingTimeoutSeconds": 60}
    return typical_spec(gangScheduling=gang, failurePolicy=policy, **changes)


def gang_pods(spec: api.FSDPJobSpec, **kwargs: Any) -> list[dict[str, Any]]:
    return templates.worker_pods(TYPICAL_JOB, spec, launch(), **kwargs)


# --- the PodGroup -------------------------------------------------------------------------------
def test_a_coscheduling_gang_gets_scheduler_plugins_podgroup_of_the_attempts_pods() -> None:
    spec = gang_spec(COSCHEDULING)
    gang = spec_gang.effective(spec, None)
    assert gang is not None
    group = podgroup.pod_group(TYPICAL_JOB, spec, gang=gang, attempt=3, members=2)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == GROUP_A3
    assert group["metadata"]["namespace"] == TYPICAL_JOB.namespace
    assert group["metadata"]["labels"][names.Label.ATTEMPT] == "3"
    assert group["metadata"]["labels"][names.Label.JOB] == TYPICAL_JOB.name
    assert group["metadata"]["ownerReferences"] == [templates.owner_reference(TYPICAL_JOB)]
    assert group["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 90}


def test_a_volcano_gang_gets_volcanos_podgroup_with_its_queue_and_priority() -> None:
    spec = gang_spec(VOLCANO, template={"spec": {"priorityClassName": "training-high"}})
    gang = spec_gang.effective(spec, None)
    assert gang is not None
    group = podgroup.pod_group(TYPICAL_JOB, spec, gang=gang, attempt=3, members=4)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1" and group["kind"] == "PodGroup"
    assert group["spec"] == {
        "minMember": 4,
        "queue": "research",
        "priorityClassName": "training-high",
    }


# --- the pods -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gang", "labels", "annotations", "scheduler"),
    [
        pytest.param(
            COSCHEDULING,
            {spec_gang.COSCHEDULING_LABEL: GROUP_A3},
            {},
            "scheduler-plugins-scheduler",
            id="coscheduling",
        ),
        pytest.param(
            VOLCANO, {}, {spec_gang.VOLCANO_ANNOTATION: GROUP_A3}, "volcano", id="volcano"
        ),
        pytest.param(
            {**COSCHEDULING, "schedulerName": "gang-scheduler"},
            {spec_gang.COSCHEDULING_LABEL: GROUP_A3},
            {},
            "gang-scheduler",
            id="coscheduling-own-scheduler",
        ),
    ],
)
def test_every_rank_of_the_attempt_is_a_member_and_goes_to_the_gang_scheduler(
    gang: dict[str, Any], labels: dict[str, str], annotations: dict[str, str], scheduler: str
) -> None:
    for pod in gang_pods(gang_spec(gang)):
        meta = pod["metadata"]
        assert labels.items() <= meta["labels"].items()
        assert annotations.items() <= meta["annotations"].items()
        assert not (spec_gang.MEMBER_KEYS - labels.keys()) & meta["labels"].keys()
        assert not (spec_gang.MEMBER_KEYS - annotations.keys()) & meta["annotations"].keys()
        assert pod["spec"]["schedulerName"] == scheduler


def test_the_template_scheduler_runs_the_plugin_when_gang_scheduling_names_none() -> None:
    spec = gang_spec(COSCHEDULING, template={"spec": {"schedulerName": "my-coscheduler"}})
    assert {p["spec"]["schedulerName"] for p in gang_pods(spec)} == {"my-coscheduler"}


def test_a_spare_is_no_member_of_the_gang_so_it_never_holds_it_back() -> None:
    for gang in (COSCHEDULING, VOLCANO):
        spec = gang_spec(gang, spares=1)
        spare = templates.spare_pod(TYPICAL_JOB, spec, launch(), index=0)
        meta = spare["metadata"]
        assert not spec_gang.MEMBER_KEYS & (meta["labels"].keys() | meta["annotations"].keys())
        gang_model = spec_gang.effective(spec, None)
        assert gang_model is not None
        assert spare["spec"]["schedulerName"] == gang_model.scheduler(None)


def test_a_template_cannot_put_the_pods_in_a_group_of_its_own_beside_the_gang() -> None:
    meta = {"labels": {spec_gang.COSCHEDULING_LABEL: "elsewhere"}}
    spec = gang_spec(VOLCANO, template={"metadata": meta})
    for pod in gang_pods(spec):
        assert spec_gang.COSCHEDULING_LABEL not in pod["metadata"]["labels"]


def test_without_gang_scheduling_the_pods_are_as_before() -> None:
    meta = {"labels": {spec_gang.COSCHEDULING_LABEL: "hand-made"}}
    spec = gang_spec(None, template={"metadata": meta, "spec": {"schedulerName": "custom"}})
    for pod in gang_pods(spec):
        assert pod["metadata"]["labels"][spec_gang.COSCHEDULING_LABEL] == "hand-made"
        assert pod["spec"]["schedulerName"] == "custom"
    assert "schedulerName" not in gang_pods(gang_spec(None))[0]["spec"]


def test_a_runtime_profiles_gang_scheduling_applies_unless_the_job_sets_its_own() -> None:
    profile = api.RuntimeProfileSpec.model_validate(
        {"namespaces": [TYPICAL_JOB.namespace], "gangScheduling": VOLCANO}
    )
    under = gang_pods(gang_spec(None, runtimeProfile="gang"), profile=profile)
    assert under[0]["metadata"]["annotations"][spec_gang.VOLCANO_ANNOTATION] == GROUP_A3
    assert under[0]["spec"]["schedulerName"] == "volcano"
    own = gang_pods(gang_spec(COSCHEDULING, runtimeProfile="gang"), profile=profile)
    assert own[0]["metadata"]["labels"][spec_gang.COSCHEDULING_LABEL] == GROUP_A3
    assert spec_gang.VOLCANO_ANNOTATION not in own[0]["metadata"]["annotations"]


def test_a_profiles_scheduler_that_disagrees_with_the_jobs_template_is_refused() -> None:
    """The profile's gang scheduling applies to a job without its own: a template naming
    another scheduler would silently lose the group, so the profile's check says so."""
    gang = {**VOLCANO, "schedulerName": "volcano"}
    profile = api.RuntimeProfileSpec.model_validate(
        {"namespaces": [TYPICAL_JOB.namespace], "gangScheduling": gang}
    )
    spec = gang_spec(None, runtimeProfile="gang")
    assert profile.refusal(spec, namespace=TYPICAL_JOB.namespace, name="gang") == ""
    spec = gang_spec(
        None, runtimeProfile="gang", template={"spec": {"schedulerName": "default-scheduler"}}
    )
    said = profile.refusal(spec, namespace=TYPICAL_JOB.namespace, name="gang")
    assert "runtime profile 'gang'" in said and "'default-scheduler' disagree" in said, said


# --- what a user reads for a wrong spec ---------------------------------------------------------
@pytest.mark.parametrize(
    ("gang", "template", "said"),
    [
        pytest.param(
            {"kind": "Gang"},
            {},
            r"(?s)gangScheduling\.kind\s+Input should be 'Coscheduling' or 'Volcano'.*'Gang'",
            id="kind",
        ),
        pytest.param(
            {"kind": "Volcano", "scheduleTimeoutSeconds": 30},
            {},
            r"gangScheduling\.scheduleTimeoutSeconds=30 is Coscheduling's; kind=Volcano",
            id="timeout-of-volcano",
        ),
        pytest.param(
            {"kind": "Coscheduling", "queue": "research"},
            {},
            r"gangScheduling\.queue='research' is Volcano's; kind=Coscheduling",
            id="queue-of-coscheduling",
        ),
        pytest.param(
            {"kind": "Coscheduling", "schedulerName": "a"},
            {"spec": {"schedulerName": "b"}},
            r"gangScheduling\.schedulerName='a' and template\.spec\.schedulerName='b' disagree",
            id="two-schedulers",
        ),
        pytest.param(
            {"kind": "Coscheduling", "scheduleTimeoutSeconds": 0},
            {},
            r"(?s)gangScheduling\.scheduleTimeoutSeconds\s+Input should be greater than or equal"
            r" to 1.*input_value=0",
            id="timeout-zero",
        ),
    ],
)
def test_a_wrong_gang_scheduling_names_the_field_the_value_and_what_is_allowed(
    gang: dict[str, Any], template: dict[str, Any], said: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=said):
        gang_spec(gang, template=template)


def test_the_crd_refuses_the_same_at_admission() -> None:
    crd = yaml.safe_load((CHART / "crds" / "fsdpjobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = schema["properties"]["gangScheduling"]
    assert field["properties"]["kind"]["enum"] == ["Coscheduling", "Volcano"]
    assert field["required"] == ["kind"]
    rules = [r["fieldPath"] for r in field["x-kubernetes-validations"]]
    assert rules == [".scheduleTimeoutSeconds", ".queue"]
    spec_rules = [r.get("fieldPath") for r in schema["x-kubernetes-validations"]]
    assert ".gangScheduling.schedulerName" in spec_rules


# --- when a PodGroup is created, kept, replaced, deleted ----------------------------------------
WANTED = {"minMember": 4}


def existing(name: str, *, ours: bool = True, **spec: Any) -> plan_of.Existing:
    return plan_of.Existing(name=name, ours=ours, spec=spec or dict(WANTED))


@pytest.mark.parametrize(
    ("found", "create", "deleted", "conflict"),
    [
        pytest.param([], True, [], None, id="first-attempt"),
        pytest.param([existing("j-g3")], False, [], None, id="a-pass-done-again-keeps-it"),
        pytest.param(
            [existing("j-g3", minMember=4, queue="default")], False, [], None, id="defaults-added"
        ),
        pytest.param([existing("j-g2", minMember=8)], True, ["j-g2"], None, id="shrunk-attempt"),
        pytest.param(
            [existing("j-g3", minMember=8)], True, ["j-g3"], None, id="same-name-other-size"
        ),
        pytest.param(
            [existing("j-g1"), existing("j-g2"), existing("j-g3")],
            False,
            ["j-g1", "j-g2"],
            None,
            id="older-ones-left-by-a-cut-pass",
        ),
        pytest.param([existing("j-g3", ours=False)], False, [], "j-g3", id="someone-elses"),
        pytest.param(
            [existing("j-g2", ours=False)], True, [], None, id="a-stranger-of-another-name-stays"
        ),
    ],
)
def test_the_attempts_podgroup_is_created_kept_or_replaced_and_older_ones_go(
    found: list[plan_of.Existing], create: bool, deleted: list[str], conflict: str | None
) -> None:
    done = plan_of.plan(name="j-g3", spec=WANTED, existing=found)
    assert done.create is create
    assert [e.name for e in done.delete] == deleted
    assert (done.conflict.name if done.conflict else None) == conflict


# --- RBAC ---------------------------------------------------------------------------------------
def test_the_operator_may_make_and_remove_podgroups_and_nothing_more() -> None:
    rules = yaml.safe_load((CHART / "files" / "rbac-rules.yaml").read_text())
    (rule,) = [r for r in rules if "podgroups" in r["resources"]]
    assert rule["resources"] == ["podgroups"]
    assert sorted(rule["apiGroups"]) == ["scheduling.volcano.sh", "scheduling.x-k8s.io"]
    assert rule["verbs"] == ["get", "list", "create", "delete"]  # no watch, update or patch
    for group in ("scheduling.x-k8s.io", "scheduling.volcano.sh"):
        assert [r for r in rules if group in r["apiGroups"]] == [rule]
    template = (CHART / "templates" / "rbac.yaml").read_text()
    assert '{{ .Files.Get "files/rbac-rules.yaml" }}' in template


# --- another scheduler kind's groups, after an edit ------------------------------------------
class FakeCustom:
    """kube.Kube's custom-objects API over a dict of {plural.group: [objects]}; a group absent
    from `served` answers 404, as where its CRD is not installed."""

    def __init__(self, served: dict[str, list[dict[str, Any]]]) -> None:
        self.served = served
        self.deleted: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []

    def _items(self, group: str, plural: str) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        key = f"{plural}.{group}"
        if key not in self.served:
            raise ApiException(status=404)
        return self.served[key]

    def list_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, **kw: Any
    ) -> Any:
        import json
        import types

        return types.SimpleNamespace(data=json.dumps({"items": self._items(group, plural)}))

    def create_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, body: dict[str, Any], **kw: Any
    ) -> None:
        self._items(group, plural).append(body)
        self.created.append(body)

    def delete_namespaced_custom_object(
        self, group: str, version: str, ns: str, plural: str, name: str, **kw: Any
    ) -> None:
        items = self._items(group, plural)
        items[:] = [o for o in items if o["metadata"]["name"] != name]
        self.deleted.append((f"{plural}.{group}", name))


class FakeKube:
    def __init__(self, custom: FakeCustom) -> None:
        self.custom = custom

    def write_timeout(self) -> float:
        return 5.0


def _group(kind: dict[str, Any], attempt: int, *, ours: bool) -> dict[str, Any]:
    spec = gang_spec(kind)
    gang = spec_gang.effective(spec, None)
    assert gang is not None
    body = podgroup.pod_group(TYPICAL_JOB, spec, gang=gang, attempt=attempt, members=4)
    if not ours:
        body["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    return body


@pytest.mark.parametrize("volcano_served", [True, False], ids=["volcano-served", "no-volcano"])
def test_an_edit_to_another_scheduler_kind_leaves_none_of_the_old_kinds_groups(
    volcano_served: bool,
) -> None:
    """The job ran under Volcano (attempts 1 and 2), then was edited to Coscheduling: attempt
    3's launch makes its Coscheduling group and deletes the job's own Volcano groups (no pod of
    it joins them, and a Volcano group keeps its minMember in that scheduler's books); a group
    someone else controls stays, and a cluster without Volcano's CRD is no error."""
    import concurrent.futures

    from fsdp_operator.io import gang as gang_io
    from fsdp_operator.run import objects, settings

    volcano = "podgroups.scheduling.volcano.sh"
    coscheduling = "podgroups.scheduling.x-k8s.io"
    old = [_group(VOLCANO, 1, ours=True), _group(VOLCANO, 2, ours=True)]
    stranger = _group(VOLCANO, 2, ours=False)
    stranger["metadata"]["name"] = "someone-elses"
    served = {coscheduling: []} | ({volcano: [*old, stranger]} if volcano_served else {})
    custom = FakeCustom(served)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        writer = objects.ObjectWriter(
            FakeKube(custom),  # type: ignore[arg-type]
            settings.Settings(),
            pool=pool,
            gang_times=objects.GangTimes(lambda: 0.0),
            gang_client=gang_io.GangClient(None),
        )
        writer._pod_group(TYPICAL_JOB, gang_spec(COSCHEDULING), launch(attempt=3), None)
    assert [c["metadata"]["name"] for c in custom.created] == [GROUP_A3]
    assert custom.created[0]["apiVersion"].startswith("scheduling.x-k8s.io/")
    if volcano_served:
        gone = [name for _, name in custom.deleted]
        assert gone == [o["metadata"]["name"] for o in old], custom.deleted
        assert [o["metadata"]["name"] for o in served[volcano]] == ["someone-elses"]
    else:
        assert custom.deleted == []
