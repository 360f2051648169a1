"""A failed attempt (policy/failure.py): charged and restarted at once from the newest checkpoint,
or failed for good (not retryable, the same OOM twice); its evidence is read before its pods go.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.policy import decide, decision, failure
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import (
    CONFIG_MSG,
    CRASH_MSG,
    NOW,
    SCRAPED,
    ckpt,
    nodes,
    observe,
    oom_killed_in,
    pods,
    running_status,
)


def test_a_second_oom_in_the_same_phase_stops_with_the_diagnosis() -> None:
    first = decide.decide(observe(pods=pods(r3=oom_killed_in("backward of block 11"))))
    again = running_status(attempt=2, last_failure=first.status.last_failure)
    d = decide.decide(
        observe(status=again, pods=pods(attempt=2, r1=oom_killed_in("backward of block 3")))
    )
    assert d.status.phase is st.Phase.FAILED and d.status.reason == "OOMKilled"
    assert d.status.message.startswith("OOMKilled twice in backward: out of memory in backward")
    assert d.launch is None and d.collect is not None, "the evidence is still kept"
    # another phase is another problem: retried
    save = decide.decide(
        observe(status=again, pods=pods(attempt=2, r1=oom_killed_in("checkpoint save")))
    )
    assert save.status.phase is st.Phase.RESTARTING


def test_crash_restarts_at_once_from_newest_checkpoint() -> None:
    failed = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 1,
        "finished": NOW - 2,
        "message": CRASH_MSG,
    }
    d = decide.decide(observe(pods=pods(r1=failed), checkpoint=ckpt(40)))
    assert d.launch == decision.Launch(attempt=2, replicas=4, resume_path="/ckpt/step-40")
    assert {x.name for x in d.delete} == {f"job-a1-{r}" for r in range(4)}
    assert {x.grace_seconds for x in d.delete} == {5}  # a broken gang cannot finish a save
    assert d.status.phase is st.Phase.RESTARTING and d.status.attempt == 2
    assert d.status.resumed_from_step == 40 and d.status.step == 40
    assert d.status.restarts == st.Restarts(total=1, application=1, infrastructure=0)
    old = d.status.history[0]
    assert old.cause is st.Cause.CRASH and old.steps_lost == 11 and old.detect_seconds == 2
    assert d.status.last_failure is not None and d.status.last_failure.step == 51
    reasons = [e.reason for e in d.events]
    assert reasons[-3:] == ["FailureDetected", "Restarting", "AttemptStarted"]


@pytest.mark.parametrize("code_over", [{"exit_code": 42}, {"message": CONFIG_MSG, "exit_code": 1}])
def test_non_retryable_fails_after_one_attempt(code_over: dict[str, Any]) -> None:
    failed = {"phase": ob.PodPhase.FAILED, "finished": NOW, **code_over}
    d = decide.decide(observe(pods=pods(r0=failed)))
    assert d.status.phase is st.Phase.FAILED and d.launch is None
    assert d.status.restarts.total == 0
    if "message" in code_over:  # the rank's own words reach the condition a user reads
        failed_condition = next(c for c in d.status.conditions if c.type == "Failed")
        assert failed_condition.message.endswith(": " + d.status.last_failure.message)
    kept = {x.name for x in d.delete}
    assert "job-a1-0" not in kept and len(kept) == 3  # the failed pod stays for its logs


def test_the_newest_five_failed_attempts_keep_their_evidence() -> None:
    """Attempt 7 fails after six failures with evidence (1-6): attempts 1 and 2 lose theirs
    (their ConfigMaps are deleted in this pass) and say so in history."""

    def failed(n: int) -> st.HistoryEntry:
        why = st.Failure(cause=st.Cause.CRASH, time=NOW - 100 + n, evidence_ref=f"job-a{n}-why")
        return st.HistoryEntry(
            attempt=n, world_size=4, ended=NOW - 99 + n, cause=why.cause, failure=why
        )

    history = [failed(n) for n in range(1, 7)]
    history.append(st.HistoryEntry(attempt=7, started=NOW - 50, world_size=4))
    status = running_status(attempt=7, history=history)
    crashed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1}
    d = decide.decide(observe(status=status, pods=pods(attempt=7, r1=crashed)))
    assert d.collect is not None and d.collect.attempt == 7 and d.collect.drop == (1, 2)
    kept = {h.attempt: h.failure.evidence_ref for h in d.status.history if h.failure}
    assert kept[1] is None and kept[2] is None and kept[3] == "job-a3-why"


def test_a_lost_nodes_pods_logs_are_not_asked_for() -> None:
    """Its kubelet cannot answer: the read would only wait out its timeout before the restart."""
    d = decide.decide(observe(nodes=nodes(down={2: NOW - 31})))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert d.collect is not None and d.collect.unreadable == (2,)


def test_the_evidence_read_goes_into_the_status_the_pass_writes() -> None:
    """What reconcile.py reads in the failed pods' logs is said by lastFailure, the attempt's
    history entry and an Event of the same pass; the decision it started from is unchanged."""
    hung = running_status(last_progress_time=NOW - 103)
    d = decide.decide(observe(status=hung, progress=None, scrape=SCRAPED))
    found = d.status.last_failure
    assert d.collect is not None and found is not None and found.cause is st.Cause.HANG
    update = {
        "evidence": "rank 2 in data loading",
        "diagnosis": "rank 2 is the odd one out",
        "evidence_ref": "job-a1-why",
    }
    better = found.model_copy(update=update)
    done = failure.explained(d, better)
    assert done.status.last_failure == better
    kept = done.status.history[0].failure
    assert kept is not None and kept.evidence_ref == "job-a1-why"
    assert kept.evidence == "rank 2 in data loading"
    said = done.events[-1]
    assert (said.type, said.reason) == (decision.EventType.WARNING, "FailureExplained")
    assert said.message == "attempt 1: rank 2 is the odd one out; rank 2 in data loading"
    assert d.status.last_failure == found and "FailureExplained" not in [e.reason for e in d.events]
    assert failure.explained(d, found).events == d.events  # nothing read, nothing said
