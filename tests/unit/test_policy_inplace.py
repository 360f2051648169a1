"""Restarts in place (policy/inplace.py; fsdp_worker.keeper.gang) and the memory tier
(checkpoint.memory): charged and kept like gang restarts, without touching the pods.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic
import pytest

from fsdp_operator.io import reports
from fsdp_operator.policy import deadlines, decide, decision
from fsdp_operator.types import api
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from fsdp_worker.contract import config_checkpoint
from tests.builders import (
    NOW,
    SCRAPED,
    in_place_progress,
    in_place_record,
    in_place_spec,
    make_spec,
    observe,
    pods,
    running_status,
)


def test_a_restart_in_place_is_charged_and_kept_without_touching_the_pods() -> None:
    before = running_status()
    before.history[-1].steps_run, before.history[-1].train_seconds = 48, 48.0
    obs = observe(
        spec=in_place_spec(), status=before, progress=in_place_progress(1, in_place_record(0))
    )
    d = decide.decide(obs)
    s = d.status
    assert d.launch is None and d.delete == () and s.phase is st.Phase.RUNNING and s.attempt == 1
    assert (s.restarts.application, s.restarts.total, s.reliability.failures) == (1, 1, 1)
    assert s.last_failure is not None and s.last_failure.cause is st.Cause.CRASH
    assert s.last_failure.pod == "job-a1-2" and s.last_failure.step == 48
    (restart,) = s.history[-1].restarts_in_place
    assert (restart.generation, restart.resumed_from_step, restart.steps_lost) == (0, 40, 8)
    assert restart.resumed == NOW - 2 and restart.steps_run == 48
    assert (restart.rendezvous, restart.loaded) == (NOW - 5, NOW - 3)  # the phases
    # Rank 0's counters started again in generation 1: the entry keeps both generations'.
    assert s.history[-1].steps_run == 53 and s.history[-1].train_seconds == 53.0
    (event,) = [e for e in d.events if e.reason == "RestartedInPlace"]
    assert "generation 1 of attempt 1" in event.message and "rank 2 pod job-a1-2" in event.message
    assert d.in_place == (restart,) and d.failure is s.last_failure
    # Seen again in the next pass: not charged twice.
    again = decide.decide(dataclasses.replace(obs, status=s))
    assert again.status.restarts.application == 1
    assert not [e for e in again.events if e.reason == "RestartedInPlace"]
    # Goodput charges the crash its recovery (failure to the next first step) and 8 redone steps.
    lost = again.status.goodput.lost_seconds if again.status.goodput else {}
    assert lost.get("Crash") == pytest.approx(6.0 + 8.0)


def test_an_oom_kill_seen_by_the_keeper_is_charged_as_oom() -> None:
    record = in_place_record(
        0, **{"class": contract.RecordClass.LIVE, "reason": "OOMKilled", "phase": "forward"}
    )
    d = decide.decide(observe(spec=in_place_spec(), progress=in_place_progress(1, record)))
    assert d.status.last_failure is not None and d.status.last_failure.cause is st.Cause.OOM
    assert d.status.history[-1].restarts_in_place[0].failure.phase == "forward"


def test_a_restart_in_place_past_the_budget_fails_the_job() -> None:
    spec = in_place_spec()
    spec = spec.model_copy(
        update={"failure_policy": spec.failure_policy.model_copy(update={"max_restarts": 1})}
    )
    status = running_status(restarts=st.Restarts(total=1, application=1))
    d = decide.decide(
        observe(spec=spec, status=status, progress=in_place_progress(1, in_place_record(0)))
    )
    assert d.status.phase is st.Phase.FAILED
    assert "maxRestarts=1" in d.status.conditions[-1].message or any(
        "maxRestarts=1" in e.message for e in d.events
    )
    assert {p.name for p in d.delete} == {f"job-a1-{r}" for r in range(4)}


def test_pods_carry_the_keeper_only_when_restarts_in_place_are_allowed() -> None:
    from fsdp_operator.render import templates

    job = templates.JobRef(namespace="ns", name="job", uid="u1")
    launch = decision.Launch(attempt=2, replicas=2, resume_path="")
    plain = templates.worker_pod(job, make_spec(), launch, node_rank=1)
    kept = templates.worker_pod(job, in_place_spec(), launch, node_rank=1)
    (c_plain,), (c_kept,) = plain["spec"]["containers"], kept["spec"]["containers"]
    assert c_plain["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert c_kept["command"][:3] == ["python", "-m", "fsdp_worker.keeper.gang"]
    assert c_kept["command"][3:] == c_plain["command"]
    env = {e["name"]: e.get("value") for e in c_kept["env"]}
    gang = json.loads(env[contract.ENV_GANG])
    assert gang == {
        "restarts": 3,
        "coordinator": "job-a2-0.job-workers.ns.svc.cluster.local:29501",
        "node": 1,
        "nodes": 2,
        "nonRetryable": [42],
        "job": "u1",
        "attempt": 2,
        "keyFile": "/var/run/fsdp-gang/key",
    }
    assert contract.ENV_GANG not in {e["name"] for e in c_plain["env"]}
    assert {"name": "gang", "containerPort": 29501, "protocol": "TCP"} in c_kept["ports"]
    # the attempt's key: its own Secret, mounted read-only into its pods only
    secret = {"secretName": "job-a2-gang", "defaultMode": 0o440}
    assert {"name": "fsdp-gang-key", "secret": secret} in kept["spec"]["volumes"]
    mount = {"name": "fsdp-gang-key", "mountPath": "/var/run/fsdp-gang", "readOnly": True}
    assert mount in c_kept["volumeMounts"]
    assert all("secret" not in v for v in plain["spec"]["volumes"])


def test_the_coordinators_in_place_records_are_read_one_per_generation() -> None:
    """What the coordinator answers (`failures`, as the keepers reported them) is what the
    operator reads; a record that names no generation is left out."""
    record = in_place_record(0)
    (read,) = reports.in_place_records([record, 7, {"node": 1}])
    assert read == reports.in_place_record(record)
    assert (read.generation, read.node, read.exit_code, read.time) == (0, 2, 1, NOW - 8)
    assert (read.termination.kind, read.termination.step) == ("RuntimeError", 48)
    assert read.termination.words == "CUDA error: an illegal memory access"


def test_with_restarts_in_place_the_operators_hang_waits_for_the_ranks_own() -> None:
    """A rank past its own deadline ends itself (class Hang) and the gang restarts in place;
    the operator's deadline comes IN_PLACE_HANG_GRACE_SECONDS later, for a gang that cannot."""
    deadline = make_spec().failure_policy.progress_deadline_seconds
    late = NOW - deadline - deadlines.HANG_EVIDENCE_GRACE_SECONDS - 1
    stale = running_status(last_progress_time=late)
    plain = decide.decide(observe(status=stale, progress=None, scrape=SCRAPED))
    assert plain.failure is not None and plain.failure.cause is st.Cause.HANG
    d = decide.decide(observe(spec=in_place_spec(), status=stale, progress=None, scrape=SCRAPED))
    assert d.status.phase is st.Phase.RUNNING and d.launch is None
    wake = late + deadline + deadlines.hang_grace(in_place_spec()) + 0.05
    assert d.requeue_after == pytest.approx(wake - NOW)
    record = in_place_record(0, **{"class": contract.FailureClass.HANG.value, "step": 50})
    hung = decide.decide(observe(spec=in_place_spec(), progress=in_place_progress(1, record)))
    assert hung.status.last_failure is not None
    assert hung.status.last_failure.cause is st.Cause.HANG


@pytest.mark.parametrize(
    ("gang", "hung", "why"),
    [
        pytest.param(None, False, "", id="not-asked"),
        pytest.param(ob.GangHealth.of({"quiet": {"0": 0.2, "1": 0.4}}), False, "", id="all-there"),
        pytest.param(
            ob.GangHealth.of({"quiet": {"0": 0.2, "1": 31.0}}),
            True,
            "keepers silent: node 1 for 31s",
            id="a-keeper-frozen",
        ),
        pytest.param(
            ob.GangHealth(answered=False, error="timed out"),
            True,
            "coordinator did not answer (timed out)",
            id="node-0-frozen",
        ),
        pytest.param(ob.GangHealth.of({"final": True}), True, "stopped restarting", id="final"),
    ],
)
def test_a_gang_whose_keepers_cannot_restart_in_place_is_not_waited_for(
    gang: ob.GangHealth | None, hung: bool, why: str
) -> None:
    """Past the deadline and its evidence grace, the operator asks the gang's coordinator (node
    rank 0's keeper) whether every keeper is there; a frozen pod's keeper falls silent (or node
    0's whole coordinator does), and the hang is declared without the in-place grace."""
    spec = in_place_spec()
    deadline = spec.failure_policy.progress_deadline_seconds
    late = NOW - deadline - deadlines.HANG_EVIDENCE_GRACE_SECONDS - 1
    stale = running_status(last_progress_time=late)
    obs = observe(
        spec=spec,
        status=stale,
        progress=None,
        scrape=SCRAPED,
        pods=pods(r0={"ip": "10.0.0.5"}),
        gang=gang,
    )
    assert deadlines.asks_the_gang(obs) == "10.0.0.5"
    d = decide.decide(obs)
    assert (d.failure is not None and d.failure.cause is st.Cause.HANG) is hung, d.failure
    if hung:
        assert d.failure is not None and why in d.failure.message, d.failure.message
    # before the deadline's grace, and past the in-place one, nobody asks
    early = dataclasses.replace(obs, status=running_status(last_progress_time=NOW - deadline))
    assert deadlines.asks_the_gang(early) is None
    over = dataclasses.replace(obs, status=running_status(last_progress_time=NOW - 200))
    assert deadlines.asks_the_gang(over) is None


def _memory_spec(**memory: Any) -> api.FSDPJobSpec:
    spec = in_place_spec()
    ckpt = spec.checkpoint.model_copy(
        update={"memory": config_checkpoint.MemoryTierConfig(**memory)}
    )
    return spec.model_copy(update={"checkpoint": ckpt})


def test_the_memory_tier_needs_restarts_in_place_and_names_the_fields() -> None:
    doc = make_spec().model_dump(by_alias=True, exclude_none=True)
    doc["checkpoint"]["memory"] = {"intervalSteps": 5}
    with pytest.raises(pydantic.ValidationError) as err:
        api.FSDPJobSpec.model_validate(doc)
    assert "checkpoint.memory" in str(err.value) and "inPlaceRestarts=0" in str(err.value)
    doc["failurePolicy"]["inPlaceRestarts"] = 2
    assert api.FSDPJobSpec.model_validate(doc).checkpoint.memory is not None
    doc["checkpoint"]["memory"]["sizeLimit"] = "lots"
    with pytest.raises(pydantic.ValidationError, match="sizeLimit"):
        api.FSDPJobSpec.model_validate(doc)


def test_pods_get_a_memory_volume_and_its_path_only_with_the_memory_tier() -> None:
    from fsdp_operator.render import templates

    job = templates.JobRef(namespace="ns", name="job", uid="u1")
    launch = decision.Launch(attempt=1, replicas=2, resume_path="")
    plain = templates.worker_pod(job, in_place_spec(), launch, node_rank=0)
    tiered = templates.worker_pod(job, _memory_spec(size_limit="3Gi"), launch, node_rank=0)
    volume = {"name": "fsdp-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "3Gi"}}
    assert volume in tiered["spec"]["volumes"]
    assert all(v["name"] != "fsdp-memory" for v in plain["spec"]["volumes"])
    (c,) = tiered["spec"]["containers"]
    assert {"name": "fsdp-memory", "mountPath": contract.MEMORY_MOUNT} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[contract.ENV_MEMORY_ROOT] == contract.MEMORY_MOUNT
    assert contract.ENV_MEMORY_ROOT not in {
        e["name"] for e in plain["spec"]["containers"][0]["env"]
    }


def test_a_restart_from_memory_is_kept_as_such_and_counts_as_progress() -> None:
    """A rank that failed with memory holding a step newer than the claim's: the no-progress
    breaker counts that step as sealed; the next generation's load is kept as from memory."""
    before = running_status()
    before.sealed_step, before.resumed_from_step = 60, 60
    record = in_place_record(0, step=75, **{contract.MEMORY_STEP_KEY: 74})
    prog = in_place_progress(1, record, resumed_from=74, resumed_from_memory=True)
    d = decide.decide(observe(spec=_memory_spec(), status=before, progress=prog))
    s = d.status
    (restart,) = s.history[-1].restarts_in_place
    assert (restart.resumed_from_step, restart.from_memory, restart.steps_lost) == (74, True, 1)
    assert s.restarts.without_progress == 0
    # Without the memory step the claim's 60 is all there is: no progress since 60.
    plain = in_place_progress(1, in_place_record(0, step=75))
    d = decide.decide(observe(spec=_memory_spec(), status=before, progress=plain))
    assert d.status.restarts.without_progress == 1
    # An in-place failure is a failure; only a recreated gang is a gang failure.
    assert (s.reliability.failures, s.reliability.gang_failures) == (1, 0)


def test_a_failure_without_a_step_is_charged_the_steps_rank_0_counted_past_the_resume() -> None:
    """A lost node's ranks say nothing (the record has no step): the steps trained again are
    where the failed generation began plus the steps rank 0 counted in it, less the step the
    next generation resumed from; rank 0's count is scraped, so this is a lower bound."""
    before = running_status()
    before.resumed_from_step = 20
    before.history[-1].resumed_from_step = 20
    before.history[-1].steps_run = 48  # generation 0 trained 20 -> 68 (as last scraped)
    record = in_place_record(0, step=None, **{"class": contract.FailureClass.RUNTIME.value})
    prog = in_place_progress(1, record, resumed_from=66)
    d = decide.decide(observe(spec=in_place_spec(), status=before, progress=prog))
    (restart,) = d.status.history[-1].restarts_in_place
    assert (restart.steps_run, restart.resumed_from_step, restart.steps_lost) == (48, 66, 2)
