"""Launch truth tables (policy/launch.py): a new job's first attempt, the pods of an attempt made
once (and again when the operator stopped half-way), backoff and draining before the next, and
where the next attempt resumes from, including the rules under which its pods choose.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fsdp_operator.policy import decide, decision, launch
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from tests.builders import (
    CRASHED,
    NOW,
    ckpt,
    observe,
    pods,
    running_status,
)


def test_new_job_launches_attempt_one_at_full_size_from_scratch() -> None:
    d = decide.decide(observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None))
    assert d.launch == decision.Launch(attempt=1, replicas=4, resume_path="")
    assert d.status.phase is st.Phase.PENDING and d.status.attempt == 1
    assert d.status.world_size == 4 and not d.status.pods_created
    assert [e.reason for e in d.events] == ["AttemptStarted"]


def test_pods_seen_once_then_running() -> None:
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    d = decide.decide(observe(status=status))
    assert d.status.pods_created and d.status.phase is st.Phase.RUNNING and d.launch is None


def test_operator_died_between_status_write_and_pod_creation_recreates_missing_pods() -> None:
    status = running_status(phase=st.Phase.PENDING, pods_created=False, resume_path="/ckpt/s")
    d = decide.decide(observe(status=status, pods=pods(n=2)))
    assert d.launch == decision.Launch(attempt=1, replicas=4, resume_path="/ckpt/s")
    assert d.failure is None and d.status.attempt == 1


def test_pods_just_created_are_awaited_not_created_again() -> None:
    """The watch lags the creates: missing pods this process made a moment ago are waited for
    (no 409 storm), and created again only once that wait is over."""
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    d = decide.decide(observe(status=status, pods=pods(n=2), created_at=NOW - 1))
    assert d.launch is None and d.requeue_after == pytest.approx(launch.EXPECT_SECONDS - 1)
    later = decide.decide(
        observe(status=status, pods=pods(n=2), created_at=NOW - launch.EXPECT_SECONDS)
    )
    assert later.launch == decision.Launch(attempt=1, replicas=4, resume_path="")


def test_backoff_wait_then_launch() -> None:
    status = running_status(phase=st.Phase.RESTARTING, next_attempt_at=NOW + 5)
    d = decide.decide(observe(status=status, pods=[]))
    assert d.launch is None and d.requeue_after == 5
    status = running_status(phase=st.Phase.RESTARTING, next_attempt_at=NOW - 1)
    d = decide.decide(observe(status=status, pods=[]))
    assert d.launch is not None and d.launch.attempt == 2


def test_drain_waits_for_old_pods_to_save_then_launches_at_full_size() -> None:
    status = running_status(
        phase=st.Phase.RESTARTING,
        replicas=2,
        drain=True,
        next_attempt_at=NOW,
        failure_observed=NOW - 3,
    )
    deleting = pods(n=2, r0={"deleting": True}, r1={"deleting": True})
    d = decide.decide(observe(status=status, pods=deleting))
    assert d.launch is None and d.requeue_after == 1.0
    d = decide.decide(observe(status=status, pods=[], checkpoint=ckpt(52)))
    assert d.launch == decision.Launch(attempt=2, replicas=4, resume_path="/ckpt/step-52")


def _rules(d: decision.Decision) -> contract.ResumeRules:
    assert d.launch is not None and d.launch.resume_path == contract.RESUME_AUTO
    return contract.ResumeRules.parse(d.launch.resume_rules)


def test_a_blind_operator_restarts_into_auto_with_its_lineage_and_the_sealed_step() -> None:
    # The chart's default: no checkpoint mount in the operator. Rank 0 reported step 40 sealed.
    seen = ob.Progress(step=50, checkpoint_step=40)
    obs = observe(pods=pods(r1=CRASHED), checkpoint=None, checkpoints_visible=False, progress=seen)
    d = decide.decide(obs)
    assert _rules(d) == contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40)
    assert d.status.sealed_step == 40 and d.status.resume_path == "auto"
    assert d.status.resumed_from_step is None  # known once its pods say which one they loaded
    started = [e.message for e in d.events if e.reason == "AttemptStarted"]
    assert started == [
        "attempt 2: 4 pods from the checkpoint its pods choose (the operator cannot read them, "
        "expecting step 40)"
    ]


def test_an_attempt_that_never_said_where_it_resumed_bounds_the_next_lineage() -> None:
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40).to_json()
    status = running_status(attempt=2, resume_path="auto", resume_rules=rules, sealed_step=40)
    crashed = pods(attempt=2, r0=CRASHED)
    obs = observe(status=status, pods=crashed, checkpoint=None, progress=None)
    obs = dataclasses.replace(obs, checkpoints_visible=False)
    assert _rules(decide.decide(obs)) == contract.ResumeRules(
        attempt=2, resumed_from_step=40, expect_step=40
    )


def test_a_sealed_step_the_operator_cannot_find_is_never_a_fresh_start() -> None:
    # It reads the directory, finds nothing usable, yet step 40 was sealed: the pods must find
    # it (or stop and say why), not train again from 0.
    status = running_status(sealed_step=40)
    d = decide.decide(observe(status=status, pods=pods(r1=CRASHED), checkpoint=None, progress=None))
    assert _rules(d) == contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40)


@pytest.mark.parametrize(
    ("visible", "attempt_over"),
    [(True, {}), (True, {"status": st.FSDPJobStatus(), "pods": []})],
    ids=["nothing-sealed-and-seen-empty", "first-attempt-seen-empty"],
)
def test_a_fresh_start_where_it_is_right(visible: bool, attempt_over: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"pods": pods(r1=CRASHED), "progress": None, **attempt_over}
    d = decide.decide(observe(checkpoint=None, checkpoints_visible=visible, **fields))
    assert d.launch is not None and d.launch.resume_path == "" and d.launch.resume_rules == ""


def test_a_blind_first_attempt_chooses_too() -> None:
    # The operator cannot see what the job's directory holds: another job's checkpoints there
    # (the same name, deleted and created again) must stop it, or be resumed from with
    # resumeFromPreviousJobs, as when it reads them; a fresh "" would train over them.
    obs = observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None)
    d = decide.decide(dataclasses.replace(obs, checkpoints_visible=False))
    assert d.launch is not None and d.launch.resume_path == contract.RESUME_AUTO
    assert _rules(d) == contract.ResumeRules(attempt=0, resumed_from_step=None)


def test_a_blind_operator_takes_new_checkpoints_from_rank_0s_report() -> None:
    # Attempt 2 chose step 40 itself, then sealed 45: that is progress, so a crash after it is
    # not one "without progress" (the circuit breaker would otherwise stop a healthy job).
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40).to_json()
    restarts = st.Restarts(total=1, application=1, without_progress=1)
    status = running_status(
        attempt=2,
        resume_path="auto",
        resume_rules=rules,
        sealed_step=40,
        resumed_from_step=40,
        restarts=restarts,
    )
    seen = ob.Progress(step=46, checkpoint_step=45)
    obs = observe(status=status, pods=pods(attempt=2, r1=CRASHED), checkpoint=None, progress=seen)
    d = decide.decide(
        dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/job")
    )
    assert d.status.last_checkpoint is not None
    assert (d.status.last_checkpoint.step, d.status.last_checkpoint.path) == (
        45,
        "/ckpt/job/step-45",
    )
    assert d.status.restarts.without_progress == 0 and d.status.sealed_step == 45
    assert _rules(d) == contract.ResumeRules(attempt=2, resumed_from_step=40, expect_step=45)
