"""How a job ends (policy/finish.py): success, suspend and resume, deadlines, TTL, an invalid spec,
a terminal job that stays so, and pods of old attempts.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

from fsdp_operator.policy import deadlines, decide, decision
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


def _ended(ranks: list[int], at: float) -> dict[str, dict[str, object]]:
    done = {"phase": ob.PodPhase.SUCCEEDED, "exit_code": 0, "finished": at}
    return {f"r{r}": done for r in ranks}


def test_pods_left_running_after_rank_0_ended_well_are_deleted_as_the_job_succeeds() -> None:
    """Seen under load: node rank 1's pod ran on for minutes after rank 0's sealed the last step
    and exited 0; the job waited for it for ever. Within the exit barrier's grace the gang may
    still be ending together; past it, training is over and the pods left running go."""
    grace = deadlines.EXIT_GRACE_SECONDS
    early = decide.decide(observe(pods=pods(**_ended([0, 1], NOW - grace + 5))))
    assert early.status.phase is st.Phase.RUNNING and not early.delete and early.failure is None
    assert early.requeue_after is not None and early.requeue_after <= 5.1  # woken at the grace
    late = decide.decide(observe(pods=pods(**_ended([0, 1], NOW - grace - 1))))
    assert late.status.phase is st.Phase.SUCCEEDED and late.failure is None
    assert sorted(p.name for p in late.delete) == ["job-a1-2", "job-a1-3"]
    said = {e.reason: e.message for e in late.events}
    assert "job-a1-2, job-a1-3 still ran 90s after rank 0's pod exited 0" in said["PodsDidNotExit"]
    assert "fsdpctl logs <job> --attempt 1" in said["PodsDidNotExit"]
    # their log tails are read before they go, kept as the attempt's evidence, status untouched
    assert late.collect is not None and late.collect.told is not None
    assert [p[1] for p in late.collect.pods] == [f"job-a1-{r}" for r in range(4)]
    assert late.status.last_failure is None and late.collect.told.pod == "job-a1-2"


def test_a_pod_that_ended_well_while_rank_0_runs_on_is_a_hang_past_the_grace() -> None:
    """The gang ends together: rank 0 still running long after a peer returned is stuck, not
    finishing (a hang verdict otherwise waits for every pod to run)."""
    grace = deadlines.EXIT_GRACE_SECONDS
    early = decide.decide(observe(pods=pods(**_ended([2], NOW - grace + 5))))
    assert early.failure is None and early.status.phase is st.Phase.RUNNING
    late = decide.decide(observe(pods=pods(**_ended([2], NOW - grace - 1))))
    assert late.failure is not None and late.failure.cause is st.Cause.HANG
    assert late.failure.pod == "job-a1-0" and "job-a1-2 exited 0" in late.failure.message
