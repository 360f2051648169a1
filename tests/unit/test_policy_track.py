"""What a pass keeps before it decides (policy/track.py): checkpoints (and the corrupt ones),
rank 0's step, which checkpoint pods that chose their own loaded, and rank 0's last word.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses

import pytest

from fsdp_operator.io import kube
from fsdp_operator.io import observe as observe_mod
from fsdp_operator.policy import deadlines, decide, decision
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from tests.builders import (
    NOW,
    ckpt,
    completed,
    make_spec,
    observe,
    pods,
    running_status,
)


def test_healthy_run_records_step_and_checkpoint_and_polls() -> None:
    d = decide.decide(observe(progress=ob.Progress(step=55)))
    assert d.status.step == 55 and d.status.last_progress_time == NOW
    assert d.status.last_checkpoint == ckpt(40)
    assert d.launch is None and not d.delete
    # No poll: the next look is at the hang deadline, past the grace in which the ranks print
    # their evidence (progress wakes it earlier, probe.py).
    deadline = make_spec().failure_policy.progress_deadline_seconds
    grace = deadlines.HANG_EVIDENCE_GRACE_SECONDS
    assert d.requeue_after == pytest.approx(deadline + grace + 0.05)
    assert deadline + grace < decide.RESYNC_SECONDS


@pytest.mark.parametrize(
    ("reported", "shown", "progress_time"),
    [
        pytest.param(0, 400, NOW - 10, id="not-loaded-yet-reports-0"),
        pytest.param(399, 400, NOW - 10, id="below-the-resume-step"),
        pytest.param(401, 401, NOW, id="past-it-counts"),
    ],
)
def test_a_rank_0_that_has_not_loaded_does_not_take_the_step_back(
    reported: int, shown: int, progress_time: float
) -> None:
    """An attempt resumed at step 400: rank 0's gauge may read 0 until it has loaded."""
    resumed = running_status(attempt=2, step=400, resumed_from_step=400)
    d = decide.decide(
        observe(status=resumed, pods=pods(attempt=2), progress=ob.Progress(step=reported))
    )
    assert d.status.step == shown and d.status.last_progress_time == progress_time


def test_corrupt_checkpoint_quarantined_once() -> None:
    d = decide.decide(observe(corrupt_checkpoints=["/ckpt/step-60"]))
    assert d.quarantine == ("/ckpt/step-60",) and d.status.quarantined == ["/ckpt/step-60"]
    d2 = decide.decide(observe(status=d.status, corrupt_checkpoints=["/ckpt/step-60"]))
    assert d2.quarantine == ()


def test_pods_that_chose_say_which_step_they_loaded() -> None:
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40).to_json()
    status = running_status(
        attempt=2,
        resume_path="auto",
        resume_rules=rules,
        sealed_step=40,
        history=[st.HistoryEntry(attempt=2, started=NOW - 20, world_size=4)],
    )
    seen = ob.Progress(step=41, resumed_from=40)
    obs = observe(status=status, pods=pods(attempt=2), checkpoint=None, progress=seen)
    d = decide.decide(dataclasses.replace(obs, checkpoints_visible=False))
    assert d.status.resumed_from_step == 40 and d.status.history[-1].resumed_from_step == 40
    assert [e.message for e in d.events if e.reason == "Resumed"] == [
        "attempt 2: its pods resumed from step 40"
    ]


def _pods_report(seen: ob.Progress) -> decision.Decision:
    """Attempt 2, whose pods choose (the operator reads no claim) and were sent to find step 40
    (attempt 1 ended with 2 steps lost from it), as they report `seen`."""
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40).to_json()
    ended = st.HistoryEntry(attempt=1, started=NOW - 90, world_size=4, steps_lost=2)
    status = running_status(
        attempt=2,
        resume_path="auto",
        resume_rules=rules,
        sealed_step=40,
        history=[ended, st.HistoryEntry(attempt=2, started=NOW - 20, world_size=4)],
    )
    obs = observe(status=status, pods=pods(attempt=2), checkpoint=None, progress=seen)
    return decide.decide(dataclasses.replace(obs, checkpoints_visible=False))


def test_pods_that_found_a_newer_step_than_expected_lost_that_much_less() -> None:
    """Rank 0 sealed step 42 on SIGTERM after its last scrape: the operator counted 2 steps lost
    from the 40 it knew; the next attempt's pods found 42, so none were."""
    d = _pods_report(ob.Progress(step=43, resumed_from=42))
    assert d.status.history[0].steps_lost == 0 and d.status.resumed_from_step == 42
    d = _pods_report(ob.Progress(step=41, resumed_from=40))  # found what it was sent to find
    assert d.status.history[0].steps_lost == 2


def test_pods_that_resumed_behind_the_expected_step_say_so_and_count_the_steps() -> None:
    """Step 40 was sealed before the restart and is gone by the time the pods look (deleted,
    damaged): they resume from 20, the newest their lineage proves. A Warning says which
    steps are trained again, and the ended attempt's steps lost grow by them."""
    d = _pods_report(ob.Progress(step=21, resumed_from=20))
    behind = [e for e in d.events if e.reason == "ResumedBehind"]
    assert len(behind) == 1 and behind[0].type is decision.EventType.WARNING
    assert "step 40 was sealed before the restart" in behind[0].message
    assert "resumed from step 20" in behind[0].message and "steps 21-40 again" in behind[0].message
    assert d.status.history[0].steps_lost == 22
    d = _pods_report(ob.Progress(step=41, resumed_from=40))  # what it was sent to find
    assert "ResumedBehind" not in [e.reason for e in d.events]


def test_checkpoints_the_pods_set_aside_are_kept_and_said_once() -> None:
    # The operator cannot read the claim: rank 0 quarantined step 45 when it chose, and says so.
    page = "\n".join(
        [
            "# TYPE fsdp_checkpoint_quarantined gauge",
            'fsdp_checkpoint_quarantined{step="45"} 1.0',
            "fsdp_train_step 41",
        ]
    )
    seen = observe_mod.progress_of(kube.contract_samples(page))
    assert seen.quarantined == (45,)
    status = running_status(attempt=2, resume_path="auto")
    obs = observe(status=status, pods=pods(attempt=2), checkpoint=None, progress=seen)
    obs = dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/llama")
    d = decide.decide(obs)
    assert d.status.quarantined == ["/ckpt/llama/step-45"] and d.quarantine == ()
    said = [e.message for e in d.events if e.reason == "CheckpointQuarantined"]
    assert said == ["/ckpt/llama/step-45 failed verification; attempt 2's rank 0 set it aside"]
    again = decide.decide(dataclasses.replace(obs, status=d.status))
    assert not [e for e in again.events if e.reason == "CheckpointQuarantined"]


def test_a_finished_job_shows_where_rank_0_finished_not_its_last_scrape() -> None:
    # The last scrape saw step 199 of 300; the operator reads no claim. Rank 0's completion
    # report is the only word on the end (seen on the chart's default install).
    done = completed(300)
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    status = running_status(step=199, resume_path="auto")
    obs = observe(status=status, pods=pods(**finished), checkpoint=None, progress=None)
    obs = dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/llama")
    d = decide.decide(obs)
    assert d.status.phase is st.Phase.SUCCEEDED and d.status.step == 300
    assert d.status.last_checkpoint is not None
    assert (d.status.last_checkpoint.step, d.status.last_checkpoint.path) == (
        300,
        "/ckpt/llama/step-300",
    )
    assert d.status.sealed_step == 300


def test_an_attempt_no_scrape_saw_load_says_the_step_it_resumed_from_in_its_last_word() -> None:
    # CI under load: a job created again with resumeFromPreviousJobs trained 20 steps in 9 s
    # and ended before any scrape saw it load; its history said it resumed from nothing.
    # Rank 0's completion report carries the step it loaded.
    sums = contract.sums(
        steps_run=20, train_seconds=4.0, blocked_seconds=0.0, resumed_from=120, from_memory=False
    )
    done = completed(140, sums=sums)
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    history = [st.HistoryEntry(attempt=1, started=NOW - 10, world_size=4)]
    status = running_status(step=None, resume_path="auto", history=history)
    obs = observe(status=status, pods=pods(**finished), checkpoint=None, progress=None)
    obs = dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/llama")
    d = decide.decide(obs)
    assert d.status.phase is st.Phase.SUCCEEDED and d.status.step == 140
    assert d.status.resumed_from_step == 120 and d.status.history[-1].resumed_from_step == 120
    said = [e.message for e in d.events if e.reason == "Resumed"]
    assert said == ["attempt 1: its pods resumed from step 120"]


def test_a_completion_report_that_does_not_parse_changes_nothing() -> None:
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"]["message"] = '{"class": "Completed", "step": "x", "message": "{oops"}'
    obs = observe(status=running_status(step=199), pods=pods(**finished), progress=None)
    d = decide.decide(obs)
    assert d.status.phase is st.Phase.SUCCEEDED and d.status.step == 199
