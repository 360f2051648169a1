"""Time to resume, goodput and the checkpoint-interval record, as decide() writes them.

Pass by pass, like the operator sees a restart: a crash, the old gang going away, the new pods
bound and running, then rank 0's own milestones. No cluster and no clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.policy import decide as dc
from fsdp_operator.policy import goodput
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import CRASH_MSG, NOW, ckpt, make_spec, observe, pods, running_status

FAILED = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 2, "message": CRASH_MSG}


def _next(d: dc.Decision, **over: Any) -> ob.Observed:
    """The next pass: the status just written, and what the cluster shows now."""
    return observe(status=d.status, **over)


def _restart() -> list[dc.Decision]:
    """A crash at NOW-2, seen at NOW; the old gang is gone at +3, the new one bound at +4 and
    running at +6; rank 0 reports its process group at +8, load at +9, first step at +10."""
    d1 = dc.decide(observe(pods=pods(r1=FAILED), checkpoint=ckpt(40)))
    pending = pods(
        attempt=2, **{f"r{r}": {"phase": ob.PodPhase.PENDING, "node": None} for r in range(4)}
    )
    d2 = dc.decide(_next(d1, now=NOW + 3, pods=pending, progress=None))
    bound = pods(attempt=2, **{f"r{r}": {"phase": ob.PodPhase.PENDING} for r in range(4)})
    d3 = dc.decide(_next(d2, now=NOW + 4, pods=bound, progress=None))
    d4 = dc.decide(_next(d3, now=NOW + 6, pods=pods(attempt=2), progress=None))
    report = ob.Progress(
        step=41,
        last_step_time=NOW + 10,
        milestones={"rendezvous": NOW + 8, "loaded": NOW + 9, "first_step": NOW + 10},
        steps_run=1,
        train_seconds=0.5,
        blocked_seconds=0.0,
    )
    d5 = dc.decide(_next(d4, now=NOW + 11, pods=pods(attempt=2), progress=report))
    return [d1, d2, d3, d4, d5]


def test_a_restart_is_broken_down_phase_by_phase_from_failure_to_first_step() -> None:
    *_, d = _restart()
    entry = d.status.history[-1]
    assert entry.attempt == 2 and entry.timeline is not None
    tl = entry.timeline
    assert tl.cause is st.Cause.CRASH
    assert (tl.failed, tl.detected, tl.launched) == (NOW - 2, NOW, NOW)
    assert (tl.gang_gone, tl.scheduled, tl.running) == (NOW + 3, NOW + 4, NOW + 6)
    assert dict(st.breakdown(tl)) == {
        "detect": 2,
        "teardown": 3,
        "schedule": 1,
        "start": 2,
        "rendezvous": 2,
        "load": 1,
        "firstStep": 1,
    }
    assert st.time_to_resume(tl) == 12
    assert d.resumed is entry
    (event,) = [e for e in d.events if e.reason == "TrainingResumed"]
    assert "attempt 2 training 12.0s after Crash" in event.message
    assert "teardown 3.0s" in event.message and "load 1.0s" in event.message


def test_the_breakdown_is_reported_once() -> None:
    *_, d5 = _restart()
    report = ob.Progress(step=42, milestones={"first_step": NOW + 10}, steps_run=2)
    d6 = dc.decide(_next(d5, now=NOW + 12, pods=pods(attempt=2), progress=report))
    assert d6.resumed is None
    assert not [e for e in d6.events if e.reason == "TrainingResumed"]


def test_a_milestone_after_the_next_one_moves_back_to_it() -> None:
    """The old gang was seen gone (a pass) after the new pods were bound: it was gone by then
    at the latest. Likewise pods seen running after rank 0 stamped its rendezvous."""
    tl = st.Timeline(
        cause=st.Cause.NODE_LOST,
        failed=0,
        detected=30,
        launched=31,
        gang_gone=40,
        scheduled=32,
        running=51,
        rendezvous=50,
        loaded=52,
        first_step=53,
    )
    got = dict(st.breakdown(tl))
    assert got["teardown"] == 2 and got["schedule"] == 0  # gang gone by 32
    assert got["start"] == 18 and got["rendezvous"] == 0  # running by 50
    assert sum(v for v in got.values() if v is not None) == st.time_to_resume(tl) == 53


def test_a_missing_worker_milestone_joins_the_next_phase() -> None:
    """An older worker image reports no milestones but its steps: time from running to the
    first step is still shown, in the one phase whose end is known."""
    tl = st.Timeline(failed=0, detected=1, gang_gone=2, scheduled=3, running=4, first_step=9)
    got = dict(st.breakdown(tl))
    assert got["rendezvous"] is None and got["load"] is None and got["firstStep"] == 5


def test_a_first_attempt_has_a_start_up_timeline() -> None:
    d = dc.decide(observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None))
    tl = d.status.history[0].timeline
    assert tl is not None and tl.launched == NOW and tl.failed is None and tl.cause is None
    assert [p for p, _ in st.breakdown(tl)] == [
        "schedule",
        "start",
        "rendezvous",
        "load",
        "firstStep",
    ]


# --- goodput ----------------------------------------------------------------------------------


def _entry(attempt: int, **over: Any) -> st.HistoryEntry:
    return st.HistoryEntry(attempt=attempt, world_size=4, **over)


def _history() -> list[st.HistoryEntry]:
    """Attempt 1: started at 0, first step at 10, trained 100 s over 100 steps (1 s each),
    blocked 4 s on saves, crashed at 120 (seen at 121) with 20 steps since its checkpoint.
    Attempt 2: launched at 121, first step at 140, trained 50 s, blocked 2 s; now is 200."""
    first = st.Timeline(launched=0, first_step=10)
    second = st.Timeline(
        cause=st.Cause.CRASH, failed=120, detected=121, launched=121, first_step=140
    )
    return [
        _entry(
            1,
            started=0,
            ended=121,
            detect_seconds=1,
            cause=st.Cause.CRASH,
            steps_lost=20,
            timeline=first,
            steps_run=100,
            train_seconds=100,
            blocked_seconds=4,
        ),
        _entry(2, started=121, timeline=second, steps_run=50, train_seconds=50, blocked_seconds=2),
    ]


def test_goodput_splits_the_wall_time_by_cause() -> None:
    status = st.FSDPJobStatus(attempt=2, history=_history())
    g = goodput.account(status, now=200)
    assert g is not None and g.since == 0 and g.wall_seconds == 200
    assert g.productive_seconds == 130  # 100 + 50 trained, less 20 redone
    assert g.redone_seconds == 20
    assert g.lost_seconds == {
        "Startup": 10,
        "CheckpointSave": 6,
        "Crash": 40,  # 20 s from the failure to the next first step, plus 20 s redone
        "Other": 14,  # 200 - 130 - 56: time no measurement explains (step overheads)
    }
    assert g.fraction == 0.65


def test_a_recovery_still_in_progress_is_charged_until_now() -> None:
    history = _history()
    history[1] = history[1].model_copy(
        update={
            "timeline": history[1].timeline.model_copy(update={"first_step": None}),
            "steps_run": None,
            "train_seconds": None,
        }
    )
    g = goodput.account(st.FSDPJobStatus(attempt=2, history=history), now=150)
    assert g is not None and g.lost_seconds["Crash"] == 30 + 20  # 120 -> 150, plus redone


def test_a_queue_wait_is_counted_apart_and_left_out_of_the_fraction() -> None:
    """Preempted at 120 and re-admitted by Kueue at 1920 (30 minutes queued): the wait is the
    cluster's, so it is "Queued" and the fraction of the job's own time stays what it was; a
    low-goodput alert does not fire on a job that trains fine once admitted."""
    history = _history()
    second = history[1]
    tl = second.timeline.model_copy(
        update={"cause": st.Cause.PREEMPTED, "admitted": 1921, "first_step": 1940}
    )
    history[1] = second.model_copy(update={"timeline": tl})
    admitted = st.QueueStatus(name="q", pod_group="g", admitted=1921)
    g = goodput.account(st.FSDPJobStatus(attempt=2, history=history, queue=admitted), now=2000)
    assert g is not None and g.lost_seconds["Queued"] == 1800
    assert g.lost_seconds["Preempted"] == 20  # 120 -> 1940, less the wait
    assert g.lost_seconds["Crash"] == 20  # attempt 1's redone steps
    assert g.fraction == 0.65, "as without the wait"
    # Still waiting (its pods gated): counted as queued up to now, not as lost to the job.
    waiting = st.QueueStatus(name="q", pod_group="g")
    history[1] = second.model_copy(
        update={
            "timeline": tl.model_copy(update={"admitted": None, "first_step": None}),
            "steps_run": None,
        }
    )
    g = goodput.account(st.FSDPJobStatus(attempt=2, history=history, queue=waiting), now=1000)
    assert g is not None and g.lost_seconds["Queued"] == 1000 - 121
    assert g.lost_seconds["Preempted"] == 1  # detection: 120 -> 121


def test_goodput_survives_the_history_limit() -> None:
    """Attempts that fall off the history are folded first: the totals do not change."""
    status = st.FSDPJobStatus(attempt=2, history=_history())
    whole = goodput.account(status, now=200)
    folded = goodput.fold(None, status.history[:1], now=200)
    trimmed = status.model_copy(update={"history": status.history[1:], "goodput": folded})
    assert goodput.account(trimmed, now=200) == whole.model_copy(
        update={
            "folded_productive_seconds": 80,
            "folded_redone_seconds": 20,
            "folded_lost_seconds": {"CheckpointSave": 4, "Crash": 20, "Startup": 10},
        }
    )


def test_many_restarts_through_decide_keep_every_attempt_in_the_figure() -> None:
    """More restarts than the history holds: goodput's totals still count the first ones."""
    d = dc.decide(observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None))
    now = NOW
    spec = make_spec(
        failurePolicy={
            "maxRestarts": 1000,
            "maxRestartsWithoutProgress": 1000,
            "backoff": {"initialSeconds": 0},
        }
    )
    for attempt in range(1, st.HISTORY_LIMIT + 5):
        now += 10
        crash = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": now - 1}
        report = ob.Progress(step=10 * attempt, steps_run=5, train_seconds=5.0)
        saved = ckpt(10 * attempt - 2, attempt=attempt)  # 2 of its 5 steps will be redone
        d = dc.decide(
            observe(
                status=d.status,
                spec=spec,
                now=now - 5,
                pods=pods(attempt=attempt),
                progress=report,
                checkpoint=saved,
            )
        )
        d = dc.decide(
            observe(
                status=d.status,
                spec=spec,
                now=now,
                pods=pods(attempt=attempt, r0=crash),
                checkpoint=saved,
                progress=None,
            )
        )
    g = d.status.goodput
    assert g is not None and len(d.status.history) == st.HISTORY_LIMIT
    attempts = st.HISTORY_LIMIT + 4  # each trained, then crashed; one more was just launched
    assert g.folded_productive_seconds == 3 * 5  # the 5 attempts no longer in history
    assert g.productive_seconds == pytest.approx(3 * attempts)
    assert g.redone_seconds == pytest.approx(2 * attempts)
    total = g.productive_seconds + sum(g.lost_seconds.values())
    assert total == pytest.approx(g.wall_seconds, abs=0.01)
    assert d.status.reliability.failures == st.HISTORY_LIMIT + 4


def test_goodput_alone_is_rewritten_at_most_every_30_seconds() -> None:
    """A healthy job whose status did not change otherwise is not patched every pass."""
    base = dc.decide(observe(progress=ob.Progress(step=50)))
    again = dc.decide(observe(status=base.status, now=NOW + 5, progress=ob.Progress(step=50)))
    assert again.status == base.status
    later = dc.decide(observe(status=base.status, now=NOW + 31, progress=ob.Progress(step=50)))
    assert later.status.goodput is not None and base.status.goodput is not None
    assert later.status.goodput.wall_seconds == base.status.goodput.wall_seconds + 31


# --- reliability and the checkpoint interval -------------------------------------------------


def test_failures_and_uptime_are_counted_and_planned_stops_are_not_failures() -> None:
    d = dc.decide(observe(pods=pods(r1=FAILED)))
    assert d.status.reliability == st.Reliability(failures=1, gang_failures=1, uptime_seconds=198)
    resize = running_status(history=[st.HistoryEntry(attempt=1, started=NOW - 100, world_size=4)])
    d = dc.decide(observe(status=resize, spec=make_spec(suspend=True)))
    assert d.status.reliability == st.Reliability(failures=0, uptime_seconds=100)


def _auto_spec() -> Any:
    return make_spec(checkpoint={"intervalSteps": "auto", "claimName": "ckpt"})


def test_auto_pods_are_told_the_failure_record_and_the_last_costs() -> None:
    status = running_status(
        reliability=st.Reliability(failures=2, uptime_seconds=3600),
        checkpoint_interval=st.CheckpointInterval(
            steps=40, auto=True, save_seconds=3.0, step_seconds=0.5, mtbf_seconds=9000, failures=2
        ),
    )
    d = dc.decide(observe(status=status, spec=_auto_spec(), pods=pods(r1=FAILED)))
    assert d.launch is not None
    assert d.launch.reliability == (
        '{"failures":3,"uptimeSeconds":3798.0,"saveSeconds":3.0,"stepSeconds":0.5,'
        '"gangFailures":1}'
    )


def test_a_fixed_interval_sets_no_reliability_env() -> None:
    d = dc.decide(observe(pods=pods(r1=FAILED)))
    assert d.launch is not None and d.launch.reliability == ""


def test_a_new_auto_interval_is_in_status_and_an_event_with_its_inputs() -> None:
    chosen = st.CheckpointInterval(
        steps=120, auto=True, save_seconds=2.5, step_seconds=0.25, mtbf_seconds=21600, failures=0
    )
    d = dc.decide(observe(spec=_auto_spec(), progress=ob.Progress(step=50, interval=chosen)))
    assert d.status.checkpoint_interval == chosen
    (event,) = [e for e in d.events if e.reason == "CheckpointInterval"]
    assert event.message == (
        "checkpoint every 120 steps (auto, Young/Daly): blocking save 2.5s, step 0.25s, "
        "MTBF 6.00h from 0 failure(s) and the prior"
    )
    same = chosen.model_copy(update={"mtbf_seconds": 21700})  # a drifting input, same steps
    again = dc.decide(
        observe(status=d.status, spec=_auto_spec(), progress=ob.Progress(step=51, interval=same))
    )
    assert again.status.checkpoint_interval == same
    assert not [e for e in again.events if e.reason == "CheckpointInterval"]


# --- hang deadline --------------------------------------------------------------------------


def test_the_progress_deadline_counts_from_running_not_from_launch() -> None:
    """Pods Pending for 90 s (a large image) then running for 20 s: not a hang at 100 s."""
    tl = st.Timeline(launched=NOW - 110, running=NOW - 20)
    status = running_status(
        last_progress_time=None,
        attempt_started=NOW - 110,
        step=None,
        history=[st.HistoryEntry(attempt=1, started=NOW - 110, world_size=4, timeline=tl)],
    )
    scraped = ob.ScrapeHealth("job-a1-0", failures=0)
    quiet = {"progress": None, "scrape": scraped, "checkpoint": None}  # no step, no checkpoint
    d = dc.decide(observe(status=status, **quiet))
    assert d.failure is None
    later = dc.decide(observe(status=status, now=NOW + 83, **quiet))
    assert later.failure is not None and later.failure.cause is st.Cause.HANG
