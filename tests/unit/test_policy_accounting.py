"""The books (policy/accounting.py): what each attempt ran, from rank 0's scrapes and its final
sums, and when it was running again. Goodput's own arithmetic is tests/unit/test_goodput.py.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import json

import pytest

from fsdp_operator.policy import accounting, decide
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from tests.builders import (
    CRASHED,
    NOW,
    completed,
    make_spec,
    observe,
    pods,
    running_status,
)


def test_recovery_duration_recorded_when_new_attempt_runs() -> None:
    status = running_status(
        phase=st.Phase.RESTARTING,
        attempt=2,
        pods_created=False,
        failure_observed=NOW - 7,
        history=[st.HistoryEntry(attempt=2, started=NOW - 7, world_size=4)],
    )
    d = decide.decide(observe(status=status, pods=pods(attempt=2)))
    assert d.status.phase is st.Phase.RUNNING
    assert d.status.history[-1].recover_seconds == 7 and d.recovered is not None


def test_rank_0s_final_sums_count_the_steps_after_the_last_scrape() -> None:
    # The last scrape saw 40 steps in 8 s; rank 0 ran 50 in 10 s before it exited: goodput
    # counts all 50 (an attempt's last seconds were "Other" before).
    sums = contract.sums(steps_run=50, train_seconds=10.0, blocked_seconds=0.75)
    done = completed(60, sums=sums)
    history = [
        st.HistoryEntry(
            attempt=1,
            started=NOW - 20,
            world_size=4,
            steps_run=40,
            train_seconds=8.0,
            blocked_seconds=0.5,
        )
    ]
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    obs = observe(status=running_status(step=50, history=history), pods=pods(**finished))
    d = decide.decide(obs)
    entry = d.status.history[-1]
    assert d.status.phase is st.Phase.SUCCEEDED
    assert (entry.steps_run, entry.train_seconds, entry.blocked_seconds) == (50, 10.0, 0.75)


@pytest.mark.parametrize("in_place", [False, True], ids=["one-process", "restarted-in-place"])
def test_rank_0s_final_milestones_complete_a_time_to_resume_no_scrape_saw(in_place: bool) -> None:
    # Attempt 2 trained 10 s after a crash, on a machine too busy for the operator's scrapes
    # (seen in CI): its time to resume had no first step. Rank 0's completion report has it.
    # After restarts in place the process is a later generation's: its milestones are not the
    # attempt's.
    t0 = NOW - 30
    reached = {"rendezvous": t0 + 5.0, "loaded": t0 + 5.6, "first_step": t0 + 5.8}
    sums = contract.sums(
        steps_run=50, train_seconds=10.0, blocked_seconds=0.0, milestones={**reached, "bogus": 1.0}
    )
    assert contract.parse_milestones({contract.SUMS: sums}) == reached
    assert "milestones" not in contract.totals(sums)
    done = completed(60, sums=sums)
    tl = st.Timeline(
        cause=st.Cause.CRASH,
        failed=t0 - 2,
        detected=t0 - 1,
        gang_gone=t0 + 1,
        launched=t0 + 0.5,
        scheduled=t0 + 1.5,
        running=t0 + 3,
    )
    crash = st.Failure(cause=st.Cause.CRASH, rank=1, time=t0 + 4)
    history = [
        st.HistoryEntry(
            attempt=2,
            started=t0,
            world_size=4,
            timeline=tl,
            restarts_in_place=[st.InPlaceRestart(generation=0, failure=crash)] if in_place else [],
        )
    ]
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    status = running_status(attempt=2, step=12, history=history)
    d = decide.decide(observe(status=status, pods=pods(attempt=2, **finished)))
    got = d.status.history[-1].timeline
    assert d.status.phase is st.Phase.SUCCEEDED and got is not None
    if in_place:
        assert (got.rendezvous, got.loaded, got.first_step) == (None, None, None)
        return
    assert (got.rendezvous, got.loaded, got.first_step) == tuple(reached.values())
    assert st.time_to_resume(got) == pytest.approx(7.8)
    assert "TrainingResumed" in [e.reason for e in d.events]


@pytest.mark.parametrize(("loaded", "recorded"), [(30, 30), (-1, None)], ids=["step", "fresh"])
def test_a_crashed_attempt_no_scrape_saw_load_keeps_the_step_its_rank_0_said(
    loaded: int, recorded: int | None
) -> None:
    # Rank 0 crashed 3 s into its attempt, before any scrape; its final message says what it
    # loaded (-1: nothing, so the history keeps null). The attempt is already closed.
    sums = contract.sums(steps_run=2, train_seconds=0.4, blocked_seconds=0.0, resumed_from=loaded)
    crashed = json.dumps(
        {"class": "RuntimeError", "rank": 0, "step": 32, "exitCode": 1, "message": "boom"}
        | {contract.SUMS: sums}
    )
    history = [
        st.HistoryEntry(attempt=1, started=NOW - 20, ended=NOW - 1, world_size=4),
        st.HistoryEntry(attempt=2, started=NOW, world_size=4),
    ]
    status = running_status(
        attempt=2, phase=st.Phase.RESTARTING, pods_created=False, history=history
    )
    old = pods(attempt=1, r0={"phase": ob.PodPhase.FAILED, "message": crashed})
    d = decide.decide(observe(status=status, pods=old))
    assert d.status.history[0].resumed_from_step == recorded
    assert d.status.history[1].resumed_from_step is None


@pytest.mark.parametrize(
    "milestones",
    [None, "x", [], {"first_step": "5"}, {"first_step": True}, {"first_step": -1.0}],
)
def test_malformed_final_milestones_are_ignored(milestones: object) -> None:
    sums = {"stepsRun": 5, "trainSeconds": 1.0, "blockedSeconds": 0, "milestones": milestones}
    assert contract.parse_milestones({contract.SUMS: sums}) == {}
    assert contract.parse_milestones("not a message") == {}


def test_a_crashed_rank_0s_live_record_sums_count_and_older_sums_never_lower_the_scrape() -> None:
    sums = contract.sums(steps_run=33, train_seconds=6.6, blocked_seconds=0.0)
    live = {
        "class": contract.RecordClass.LIVE,
        "rank": 0,
        "step": 33,
        "exitCode": None,
        "message": "",
        contract.SUMS: sums,
    }
    history = [
        st.HistoryEntry(attempt=1, started=NOW - 20, world_size=4, steps_run=30, train_seconds=6.0)
    ]
    killed = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 137,
        "reason": "OOMKilled",
        "finished": NOW - 1,
        "message": json.dumps(live),
    }
    d = decide.decide(observe(status=running_status(history=history), pods=pods(r0=killed)))
    entry = d.status.history[0]
    assert entry.cause is st.Cause.OOM and (entry.steps_run, entry.train_seconds) == (33, 6.6)
    stale = dict(
        live, **{contract.SUMS: contract.sums(steps_run=20, train_seconds=4.0, blocked_seconds=0.0)}
    )
    killed["message"] = json.dumps(stale)
    d = decide.decide(observe(status=running_status(history=history), pods=pods(r0=killed)))
    assert (d.status.history[0].steps_run, d.status.history[0].train_seconds) == (30, 6.0)


def test_sums_of_a_gang_this_operator_tore_down_reach_the_closed_attempt() -> None:
    # Rank 1 crashed; the operator deleted the gang and attempt 2 runs. Rank 0's SIGTERM
    # message (its totals: 47 steps, not the 40 scraped) arrives only now.
    sums = contract.sums(steps_run=47, train_seconds=9.4, blocked_seconds=3.0)
    stopped = {
        "class": contract.RecordClass.LIVE,
        "rank": 0,
        "step": 47,
        "exitCode": None,
        "message": "",
        contract.SUMS: sums,
    }
    closed = st.HistoryEntry(
        attempt=1,
        started=NOW - 60,
        ended=NOW - 10,
        world_size=4,
        cause=st.Cause.CRASH,
        steps_run=40,
        train_seconds=8.0,
        blocked_seconds=0.5,
    )
    current = st.HistoryEntry(attempt=2, started=NOW - 8, world_size=4)
    status = running_status(attempt=2, history=[closed, current], step=45)
    gone = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 143,
        "deleting": True,
        "message": json.dumps(stopped),
    }
    old = [p for p in pods(attempt=1, r0=gone) if p.rank == 0]
    d = decide.decide(observe(status=status, pods=[*old, *pods(attempt=2)]))
    first, second = d.status.history
    assert (first.steps_run, first.train_seconds) == (47, 9.4)
    assert first.blocked_seconds == 0.5, "a save after the stop is the recovery's time"
    assert first.ended == NOW - 10 and first.cause is st.Cause.CRASH
    assert second.steps_run is None
    # the same while the job waits to launch attempt 2 (the old gang still draining)
    status = running_status(
        phase=st.Phase.RESTARTING,
        history=[closed],
        drain=True,
        next_attempt_at=NOW,
        failure_observed=NOW - 3,
    )
    d = decide.decide(observe(status=status, pods=[*old, *pods(n=4)[1:]]))
    assert (d.status.history[0].steps_run, d.status.history[0].train_seconds) == (47, 9.4)


@pytest.mark.parametrize(
    "sums",
    [
        None,
        "x",
        {"stepsRun": "5", "trainSeconds": 1.0, "blockedSeconds": 0},
        {"stepsRun": True, "trainSeconds": 1.0, "blockedSeconds": 0},
        {"stepsRun": 5, "trainSeconds": -1.0, "blockedSeconds": 0},
        {"stepsRun": 5, "trainSeconds": 1.0},
    ],
)
def test_malformed_sums_are_ignored(sums: object) -> None:
    assert contract.parse_sums({contract.SUMS: sums}) is None


# --- timelines: the books an attempt's end and the next launch start (accounting.account) ------
PENDING = st.Timeline(cause=st.Cause.CRASH, failed=NOW - 12, detected=NOW - 10)
"""The timeline a crash ten seconds ago started for the attempt that follows it."""
STALLED = st.Restarts(total=1, application=1, without_progress=1)
"""A restart already charged without progress since: the next one waits for its backoff."""


def _restarting(**over: object) -> st.FSDPJobStatus:
    """Attempt 1 ended by a crash ten seconds ago; attempt 2 is due now."""
    closed = st.HistoryEntry(attempt=1, started=NOW - 200, ended=NOW - 10, world_size=4)
    fields: dict[str, object] = {
        "phase": st.Phase.RESTARTING,
        "history": [closed],
        "next_attempt_at": NOW,
        "failure_observed": NOW - 10,
        "next_timeline": PENDING,
    }
    return running_status(**{**fields, **over})


@pytest.mark.parametrize(
    ("obs", "next_timeline", "new_timeline"),
    [
        pytest.param(
            observe(pods=pods(r3=CRASHED)),
            None,
            st.Timeline(cause=st.Cause.CRASH, failed=NOW - 2, detected=NOW, launched=NOW),
            id="crash-relaunched-at-once",
        ),
        pytest.param(
            observe(
                status=running_status(restarts=STALLED, resumed_from_step=40),
                pods=pods(r3=CRASHED),
            ),
            st.Timeline(cause=st.Cause.CRASH, failed=NOW - 2, detected=NOW),
            None,
            id="crash-waits-for-backoff",
        ),
        pytest.param(
            observe(spec=make_spec(suspend=True)),
            st.Timeline(cause=st.Cause.SUSPENDED, failed=NOW, detected=NOW),
            None,
            id="suspended",
        ),
        pytest.param(
            observe(status=_restarting(), pods=[]),
            None,
            PENDING.model_copy(update={"launched": NOW, "gang_gone": NOW}),
            id="launch-after-backoff-old-gang-gone",
        ),
        pytest.param(
            observe(status=_restarting()),
            None,
            PENDING.model_copy(update={"launched": NOW}),
            id="launch-after-backoff-old-pods-left",
        ),
        pytest.param(
            observe(status=st.FSDPJobStatus(), pods=[]),
            None,
            st.Timeline(launched=NOW),
            id="first-launch",
        ),
    ],
)
def test_an_attempts_end_and_the_next_launch_start_its_timeline(
    obs: ob.Observed, next_timeline: st.Timeline | None, new_timeline: st.Timeline | None
) -> None:
    # What `fsdpctl describe` shows as the way back to training: when the attempt failed,
    # when that was seen, when its gang was gone and the next one launched.
    before = obs.status.model_copy(deep=True)
    d = decide.decide(obs)
    assert d.status.next_timeline == next_timeline
    launched = d.status.attempt != before.attempt
    assert (d.status.history[-1].timeline if launched else None) == new_timeline
    assert obs.status == before, "decide reads the observed status, never writes it"


def test_account_is_a_function_of_the_status_before_and_after_the_policies() -> None:
    # A hang seen 3 s after it happened closed attempt 1 (finish.close_history): the books
    # start attempt 2's timeline from what the two statuses say, and nothing else.
    before = running_status()
    after = before.model_copy(deep=True)
    entry = after.history[-1]
    entry.ended, entry.cause, entry.detect_seconds = NOW, st.Cause.HANG, 3.0
    books = accounting.account(before, after, observe(status=before))
    assert after.next_timeline == st.Timeline(cause=st.Cause.HANG, failed=NOW - 3, detected=NOW)
    assert books.resumed is None and books.said == ""
    again = before.model_copy(deep=True)
    accounting.account(before, again, observe(status=before))
    assert again.next_timeline is None, "an attempt that did not end starts no timeline"
