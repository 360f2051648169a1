"""Fault scenarios on the local cluster: the operator recovers on its own, or stops with a reason.

Real API server, scheduler and controllers; real torchrun in process-backed pods; the stand-in
worker writes real markers on the shared volume. Each test injects one fault and watches what a
user would watch: status, Events, pods.
"""

from __future__ import annotations

import pytest

from localcluster import faults as lf
from tests.integration import harness

pytestmark = pytest.mark.cluster


def _attempt(jobs: harness.Jobs, name: str, n: int) -> dict:
    return harness.wait_for(
        f"attempt {n} running",
        lambda: (s := jobs.status(name)).get("attempt", 0) >= n
        and s.get("phase") == "Running"
        and s,
        timeout=60,
    )


def test_crash_restarts_from_newest_complete_checkpoint(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("crash")
    jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 12}))
    done = harness.wait_for(
        "job to succeed after one crash",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=120,
        context=operator.log_tail,
    )
    assert done["attempt"] == 2
    assert done["restarts"] == {"total": 1, "application": 1, "infrastructure": 0,
                                "withoutProgress": 0}  # fmt: skip
    assert done["lastFailure"]["cause"] == "Crash" and done["lastFailure"]["rank"] == 0
    assert done["lastFailure"]["message"] == "injected"
    first, second = done["history"][:2]
    assert first["cause"] == "Crash" and second["resumedFromStep"] == 10
    assert done["lastCheckpoint"]["step"] == 40 and done["step"] == 40
    reasons = jobs.events(name)
    assert {"AttemptStarted", "FailureDetected", "Restarting", "Succeeded"} <= set(reasons)
    # the marker of the final checkpoint names the attempt that resumed from step 10
    marker = (jobs.ckpt_dir() / "step-40" / "COMPLETE.json").read_text()
    assert '"resumed_from_step": 10' in marker and '"attempt": 2' in marker
