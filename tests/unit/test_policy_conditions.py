"""Conditions (policy/conditions.py): whether the operator reads rank 0's progress, and what the
job will not adopt: it creates nothing while something it does not own is in the way.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses

import pytest

from fsdp_operator.policy import conditions, decide, decision
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import (
    BLIND,
    condition,
    observe,
    pods,
    running_status,
)


def test_the_progress_condition_turns_back_and_is_written_once_per_change() -> None:
    d = decide.decide(observe(scrape=BLIND, pods=pods(r0={"ready": True})))
    blind = condition(d, conditions.PROGRESS_OBSERVED)
    assert blind is not None and blind.status == "False"
    again = decide.decide(
        observe(
            status=d.status,
            scrape=dataclasses.replace(BLIND, failures=9),
            pods=pods(r0={"ready": True}),
        )
    )
    assert again.status.conditions == d.status.conditions
    assert "ProgressUnobserved" not in [e.reason for e in again.events]
    one_miss = dataclasses.replace(BLIND, failures=1)
    assert decide.decide(observe(status=d.status, scrape=one_miss)).status.conditions == (
        d.status.conditions
    )
    back = decide.decide(observe(status=d.status, scrape=dataclasses.replace(BLIND, failures=0)))
    cond = condition(back, conditions.PROGRESS_OBSERVED)
    assert cond is not None and cond.status == "True" and cond.reason == "Scraped"


SQUATTER = ob.Conflict(ob.ConflictKind.FOREIGN, "pod job-a1-0", "no controller")


OLD_POD = ob.Conflict(ob.ConflictKind.PREVIOUS_JOB, "pod job-a1-0", "FSDPJob job uid old")


OLD_CKPT = ob.Conflict(ob.ConflictKind.CHECKPOINTS, "checkpoint ./step-5", "FSDPJob uid old")


@pytest.mark.parametrize(
    ("conflict", "says"),
    [
        pytest.param(SQUATTER, "waits until it is gone", id="hand-made-pod"),
        pytest.param(OLD_POD, "waits until it is gone", id="deleted-job-still-terminating"),
        pytest.param(OLD_CKPT, "resumeFromPreviousJobs: true", id="another-jobs-checkpoints"),
    ],
)
def test_a_new_job_creates_nothing_while_something_it_does_not_own_is_in_the_way(
    conflict: ob.Conflict, says: str
) -> None:
    fresh = observe(
        status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None, conflicts=[conflict]
    )
    d = decide.decide(fresh)
    cond = condition(d, conditions.CONFLICT)
    assert d.launch is None and d.status.attempt == 0 and d.status.phase is st.Phase.PENDING
    assert cond is not None and cond.status == "True" and cond.reason == conflict.kind.value
    assert conflict.what in cond.message and says in cond.message
    assert [e.reason for e in d.events] == [conflict.kind.value]
    assert d.requeue_after == conditions.CONFLICT_POLL_SECONDS
    again = decide.decide(dataclasses.replace(fresh, status=d.status))
    assert again.events == ()  # the Event is posted once, not every pass


def test_missing_pods_are_not_created_over_a_squatter_then_are_once_it_is_gone() -> None:
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    d = decide.decide(observe(status=status, pods=pods(n=3), conflicts=[SQUATTER]))
    assert d.launch is None and condition(d, conditions.CONFLICT) is not None
    cleared = decide.decide(observe(status=d.status, pods=pods(n=3)))
    assert cleared.launch == decision.Launch(attempt=1, replicas=4, resume_path="")
    cond = condition(cleared, conditions.CONFLICT)
    assert cond is not None and cond.status == "False" and cond.reason == "Resolved"


def test_pods_the_operator_takes_back_from_a_half_made_gang_are_not_a_failure() -> None:
    """A create met a name someone else holds after other ranks were created: the operator
    deletes those again. While the squatter stays, the job waits whole: no restart, no
    Evicted, nothing launched."""
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    taken_back = pods(n=3, r1={"deleting": True}, r2={"deleting": True})[1:]
    d = decide.decide(observe(status=status, pods=taken_back, conflicts=[SQUATTER]))
    assert d.failure is None and d.launch is None and d.delete == ()
    assert d.status.attempt == 1 and d.status.restarts.total == 0
    assert d.status.phase is st.Phase.PENDING and condition(d, conditions.CONFLICT) is not None
