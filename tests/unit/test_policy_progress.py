"""status.progress (policy/progress.py): how far a job is and when it should finish, as a
truth table over the statuses a user would see, and once through a whole pass.

No cluster and no clock: each row is a status and the progress `kubectl get -o wide` shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.policy import decide, progress
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import NOW, make_spec, observe, running_status

STEPS = 1000  # training.steps of every row


def first_attempt(**over: Any) -> st.HistoryEntry:
    """Attempt 1, launched 1360 s ago, first step 60 s later; 2 s a step since."""
    fields: dict[str, Any] = {
        "attempt": 1,
        "started": NOW - 1360,
        "world_size": 4,
        "timeline": st.Timeline(launched=NOW - 1360, first_step=NOW - 1300),
        "steps_run": 650,
        "train_seconds": 1300.0,
    }
    fields.update(over)
    return st.HistoryEntry(**fields)


CRASHED_AT = NOW - 700
"""Attempt 1 crashed here, 50 steps past its last checkpoint; attempt 2 stepped 100 s later."""
AFTER_A_CRASH = [
    first_attempt(
        steps_run=300,
        train_seconds=600.0,
        ended=CRASHED_AT,
        cause=st.Cause.CRASH,
        steps_lost=50,
        detect_seconds=0.0,
    ),
    st.HistoryEntry(
        attempt=2,
        started=NOW - 690,
        world_size=4,
        timeline=st.Timeline(
            cause=st.Cause.CRASH, failed=CRASHED_AT, launched=NOW - 690, first_step=NOW - 600
        ),
        steps_run=300,
        train_seconds=600.0,
    ),
]
LONG_AGO = [
    first_attempt(
        steps_run=300,
        train_seconds=600.0,
        ended=NOW - 2 * progress.WINDOW_SECONDS,
        cause=st.Cause.CRASH,
        steps_lost=50,
        detect_seconds=0.0,
        started=NOW - 3 * progress.WINDOW_SECONDS,
        timeline=st.Timeline(launched=NOW - 3 * progress.WINDOW_SECONDS),
    ),
    *AFTER_A_CRASH[1:],
]

ROWS = [
    pytest.param(
        {"phase": st.Phase.PENDING, "attempt": 0, "step": None, "history": []},
        None,
        None,
        id="a fresh job: nothing launched",
    ),
    pytest.param({"step": None}, None, None, id="launched, no step reported yet"),
    pytest.param({"step": 50}, 5.0, None, id="a step known, its pace not yet measured"),
    # 1300 productive s of 1360 less the 60 s first start: goodput 1.0; 350 steps x 2 s
    pytest.param(
        {"step": 650, "history": [first_attempt()]}, 65.0, 700, id="mid-run, never restarted"
    ),
    # the window's goodput 1100 / (1360 - 60): 100 s recovery, 50 steps redone; 450 x 2 s / it
    pytest.param(
        {"step": 550, "attempt": 2, "history": AFTER_A_CRASH},
        55.0,
        round(450 * 2 * 1300 / 1100),
        id="after a crash: the recovery and redone steps slow it",
    ),
    # the crash ended outside the window: only attempt 2 (its 100 s recovery) paces it
    pytest.param(
        {"step": 550, "attempt": 2, "history": LONG_AGO},
        55.0,
        round(450 * 2 * 700 / 600),
        id="a crash over an hour ago no longer counts",
    ),
    pytest.param(
        {"step": 1000, "history": [first_attempt()]},
        100.0,
        0,
        id="past the last step: sealing the final checkpoint",
    ),
    pytest.param(
        {
            "phase": st.Phase.SUCCEEDED,
            "step": 1000,
            "finished": NOW - 5,
            "history": [first_attempt(ended=NOW - 5)],
        },
        100.0,
        0,
        id="finished",
    ),
    pytest.param(
        {"phase": st.Phase.SUCCEEDED, "step": None},
        100.0,
        0,
        id="succeeded by its pods' word with no step scraped",
    ),
    pytest.param(
        {"phase": st.Phase.FAILED, "step": 650, "history": [first_attempt(ended=NOW)]},
        65.0,
        None,
        id="failed: no finish to predict",
    ),
    pytest.param(
        {"phase": st.Phase.SUSPENDED, "step": 650, "history": [first_attempt(ended=NOW)]},
        65.0,
        None,
        id="suspended: its finish waits on a user",
    ),
]


@pytest.mark.parametrize(("fields", "percent", "remaining"), ROWS)
def test_progress_truth_table(
    fields: dict[str, Any], percent: float | None, remaining: int | None
) -> None:
    found = progress.progress(running_status(**fields), steps=STEPS, now=NOW)
    if percent is None:
        assert found is None
        return
    assert found is not None
    assert (found.percent, found.estimated_seconds_remaining) == (percent, remaining)


def test_a_restart_lowers_the_pace_the_estimate_assumes() -> None:
    # The same step and step time with and without the crash: the crash's cost is in the estimate.
    began = st.Timeline(launched=NOW - 1160, first_step=NOW - 1100)
    smooth = first_attempt(timeline=began, steps_run=550, train_seconds=1100.0)
    calm = progress.progress(running_status(step=550, history=[smooth]), steps=STEPS, now=NOW)
    crashed = running_status(step=550, attempt=2, history=AFTER_A_CRASH)
    rough = progress.progress(crashed, steps=STEPS, now=NOW)
    assert calm is not None and rough is not None
    assert calm.estimated_seconds_remaining == 450 * 2
    assert (rough.estimated_seconds_remaining or 0) > 450 * 2


def test_a_pass_writes_progress_in_camel_case_and_keeps_it_while_nothing_changes() -> None:
    spec = make_spec(training={"globalBatchSize": 8, "microBatchSize": 1, "steps": STEPS})
    status = running_status(step=650, history=[first_attempt()])
    scraped = ob.Progress(step=650)
    d = decide.decide(observe(spec=spec, status=status, progress=scraped))
    assert d.status.progress == st.Progress(percent=65.0, estimated_seconds_remaining=700)
    wire = d.status.model_dump(mode="json", by_alias=True)["progress"]
    assert wire == {"percent": 65.0, "estimatedSecondsRemaining": 700}
    # 20 s later nothing else moved: the status (and its estimate) is not rewritten;
    again = decide.decide(observe(spec=spec, status=d.status, progress=scraped, now=NOW + 20))
    assert again.status == d.status
    # with goodput's refresh (30 s) it is: 20 s more without a step lower the window's goodput.
    later = decide.decide(observe(spec=spec, status=d.status, progress=scraped, now=NOW + 40))
    assert later.status.progress == st.Progress(percent=65.0, estimated_seconds_remaining=722)
