"""How a job ends (policy/finish.py): success, suspend and resume, deadlines, TTL, an invalid spec,
a terminal job that stays so, and pods of old attempts.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

from fsdp_operator.policy import decide, decision
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import (
    NOW,
    ckpt,
    make_spec,
    observe,
    pods,
    running_status,
)


def test_success_when_every_pod_exits_zero() -> None:
    done = {"phase": ob.PodPhase.SUCCEEDED, "exit_code": 0}
    d = decide.decide(observe(pods=pods(**{f"r{r}": done for r in range(4)})))
    assert d.status.phase is st.Phase.SUCCEEDED and not d.delete and d.launch is None


def test_suspend_drains_then_resume_launches_next_attempt() -> None:
    d = decide.decide(observe(spec=make_spec(suspend=True)))
    assert d.status.phase is st.Phase.SUSPENDED and len(d.delete) == 4 and d.status.drain
    suspended = d.status
    d = decide.decide(observe(spec=make_spec(suspend=True), status=suspended, pods=[]))
    assert not d.delete and d.launch is None
    d = decide.decide(observe(status=suspended, pods=[], checkpoint=ckpt(50)))
    assert d.launch == decision.Launch(attempt=2, replicas=4, resume_path="/ckpt/step-50")
    assert d.status.restarts.total == 0


def test_active_deadline_fails_and_tears_down() -> None:
    spec = make_spec(activeDeadlineSeconds=100)
    d = decide.decide(observe(spec=spec))
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.DEADLINE
    assert len(d.delete) == 4


def test_ttl_after_finished_deletes_the_job() -> None:
    spec = make_spec(ttlSecondsAfterFinished=60)
    status = running_status(phase=st.Phase.SUCCEEDED, finished=NOW - 30)
    d = decide.decide(observe(spec=spec, status=status))
    assert not d.delete_job and d.requeue_after == 30
    d = decide.decide(observe(spec=spec, status=status, now=NOW + 31))
    assert d.delete_job


def test_invalid_spec_fails_without_pods() -> None:
    d = decide.decide(
        observe(status=st.FSDPJobStatus(), pods=[], spec_error="template: volume at /ckpt")
    )
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.INVALID_SPEC
    assert d.launch is None and "volume at /ckpt" in d.status.message


def test_terminal_job_stays_terminal() -> None:
    status = running_status(phase=st.Phase.FAILED)
    d = decide.decide(observe(status=status, pods=pods(r0={"phase": ob.PodPhase.FAILED})))
    assert d.status.phase is st.Phase.FAILED and d.launch is None and not d.delete


def test_stale_pods_of_old_attempts_are_deleted() -> None:
    status = running_status(attempt=2)
    d = decide.decide(observe(status=status, pods=[*pods(attempt=2), *pods(attempt=1, n=1)]))
    assert [x.name for x in d.delete] == ["job-a1-0"]
