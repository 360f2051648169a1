"""The books (policy/accounting.py): what each attempt ran, from rank 0's scrapes and its final
sums, and when it was running again. Goodput's own arithmetic is tests/unit/test_goodput.py.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import json

import pytest

from fsdp_operator.policy import decide
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from tests.builders import (
    NOW,
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
    done = json.dumps(
        {
            "class": contract.COMPLETED,
            "rank": 0,
            "step": 60,
            "exitCode": 0,
            "message": contract.completion_message(sealed_step=60),
            contract.SUMS: sums,
        }
    )
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
    done = json.dumps(
        {
            "class": contract.COMPLETED,
            "rank": 0,
            "step": 60,
            "exitCode": 0,
            "message": contract.completion_message(sealed_step=60),
            contract.SUMS: sums,
        }
    )
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
        "class": contract.LIVE,
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
        "class": contract.LIVE,
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
