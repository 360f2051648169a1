"""Truth tables for decide(): every cause, budget, backoff, shrink/grow, lineage and lifecycle case.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic
import pytest

from fsdp_operator.io import kube
from fsdp_operator.io import observe as observe_mod
from fsdp_operator.policy import decide as dc
from fsdp_operator.policy import detect, restarts
from fsdp_operator.types import api
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from fsdp_worker.contract import config

NOW = 1_000_000.0


def make_spec(**over: Any) -> api.FSDPJobSpec:
    doc: dict[str, Any] = {
        "replicas": 4,
        "minReplicas": 2,
        "image": "worker:1",
        "training": {"globalBatchSize": 8, "microBatchSize": 1},
        "failurePolicy": {
            "maxRestarts": 3,
            "maxInfraRestarts": 5,
            "maxRestartsWithoutProgress": 3,
            "nonRetryableExitCodes": [42],
            "backoff": {"initialSeconds": 10, "maxSeconds": 60},
            "nodeLossGraceSeconds": 30,
            "progressDeadlineSeconds": 100,
            "pendingTimeoutSeconds": 50,
        },
    }
    for key, value in over.items():
        doc[key] = value
    return api.FSDPJobSpec.model_validate(doc)


def running_status(**over: Any) -> st.FSDPJobStatus:
    base = {
        "phase": st.Phase.RUNNING,
        "attempt": 1,
        "replicas": 4,
        "world_size": 4,
        "pods_created": True,
        "attempt_started": NOW - 200,
        "last_progress_time": NOW - 10,
        "step": 50,
        "started": NOW - 200,
        "history": [st.HistoryEntry(attempt=1, started=NOW - 200, world_size=4)],
    }
    base.update(over)
    return st.FSDPJobStatus(**base)


def pods(attempt: int = 1, n: int = 4, **over: Any) -> list[ob.PodView]:
    """n healthy running pods, one per node; `over` maps rank -> field overrides."""
    out = []
    for r in range(n):
        fields: dict[str, Any] = {
            "name": f"job-a{attempt}-{r}",
            "attempt": attempt,
            "rank": r,
            "phase": ob.PodPhase.RUNNING,
            "node": f"node-{r}",
        }
        fields.update(over.get(f"r{r}", {}))
        out.append(ob.PodView(**fields))
    return out


def nodes(n: int = 4, down: dict[int, float] | None = None) -> list[ob.NodeView]:
    down = down or {}
    return [
        ob.NodeView(name=f"node-{i}", ready=i not in down, not_ready_since=down.get(i))
        for i in range(n)
    ]


def ckpt(step: int, attempt: int = 1) -> st.CheckpointRef:
    return st.CheckpointRef(step=step, path=f"/ckpt/step-{step}", attempt=attempt, world_size=4)


def observe(**over: Any) -> ob.Observed:
    fields: dict[str, Any] = {
        "spec": make_spec(),
        "status": running_status(),
        "generation": 1,
        "now": NOW,
        "pods": pods(),
        "nodes": nodes(),
        "checkpoint": ckpt(40),
        "progress": ob.Progress(step=50),
    }
    fields.update(over)
    return ob.Observed(**fields)


# --- a fresh job ------------------------------------------------------------------------------


def test_new_job_launches_attempt_one_at_full_size_from_scratch() -> None:
    d = dc.decide(observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None))
    assert d.launch == dc.Launch(attempt=1, replicas=4, resume_path="")
    assert d.status.phase is st.Phase.PENDING and d.status.attempt == 1
    assert d.status.world_size == 4 and not d.status.pods_created
    assert [e.reason for e in d.events] == ["AttemptStarted"]


def test_pods_seen_once_then_running() -> None:
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    d = dc.decide(observe(status=status))
    assert d.status.pods_created and d.status.phase is st.Phase.RUNNING and d.launch is None


def test_operator_died_between_status_write_and_pod_creation_recreates_missing_pods() -> None:
    status = running_status(phase=st.Phase.PENDING, pods_created=False, resume_path="/ckpt/s")
    d = dc.decide(observe(status=status, pods=pods(n=2)))
    assert d.launch == dc.Launch(attempt=1, replicas=4, resume_path="/ckpt/s")
    assert d.failure is None and d.status.attempt == 1


def test_pods_just_created_are_awaited_not_created_again() -> None:
    """The watch lags the creates: missing pods this process made a moment ago are waited for
    (no 409 storm), and created again only once that wait is over."""
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    d = dc.decide(observe(status=status, pods=pods(n=2), created_at=NOW - 1))
    assert d.launch is None and d.requeue_after == pytest.approx(dc.EXPECT_SECONDS - 1)
    later = dc.decide(observe(status=status, pods=pods(n=2), created_at=NOW - dc.EXPECT_SECONDS))
    assert later.launch == dc.Launch(attempt=1, replicas=4, resume_path="")


def test_healthy_run_records_step_and_checkpoint_and_polls() -> None:
    d = dc.decide(observe(progress=ob.Progress(step=55)))
    assert d.status.step == 55 and d.status.last_progress_time == NOW
    assert d.status.last_checkpoint == ckpt(40)
    assert d.launch is None and not d.delete
    # No poll: the next look is at the hang deadline, past the grace in which the ranks print
    # their evidence (progress wakes it earlier, probe.py).
    deadline = make_spec().failure_policy.progress_deadline_seconds
    grace = detect.HANG_EVIDENCE_GRACE_SECONDS
    assert d.requeue_after == pytest.approx(deadline + grace + 0.05)
    assert deadline + grace < dc.RESYNC_SECONDS


# --- detection: each cause ----------------------------------------------------------------------

CRASH_MSG = '{"class": "RuntimeError", "rank": 3, "step": 51, "exitCode": 1, "message": "boom"}'
CONFIG_MSG = '{"class": "ConfigError", "rank": 0, "step": null, "exitCode": 78, "message": "bad"}'


@pytest.mark.parametrize(
    ("rank_over", "cause"),
    [
        ({"phase": ob.PodPhase.FAILED, "exit_code": 1, "message": CRASH_MSG}, st.Cause.CRASH),
        ({"phase": ob.PodPhase.FAILED, "exit_code": 137, "reason": "OOMKilled"}, st.Cause.OOM),
        (
            {"phase": ob.PodPhase.FAILED, "exit_code": 1, "message": CONFIG_MSG},
            st.Cause.CONFIG_ERROR,
        ),
        ({"phase": ob.PodPhase.FAILED, "exit_code": 42}, st.Cause.NON_RETRYABLE),
        ({"phase": ob.PodPhase.FAILED, "exit_code": 1, "message": "not json"}, st.Cause.CRASH),
        ({"disrupted": True}, st.Cause.EVICTED),
        ({"deleting": True}, st.Cause.EVICTED),
    ],
)
def test_pod_level_causes(rank_over: dict[str, Any], cause: st.Cause) -> None:
    d = dc.decide(observe(pods=pods(r3={**rank_over, "finished": NOW - 1})))
    assert d.failure is not None and d.failure.cause is cause
    assert d.failure.pod == "job-a1-3" and d.failure.rank == 3 and d.failure.node == "node-3"
    assert d.status.last_failure == d.failure


def test_worker_message_reaches_status() -> None:
    over = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "message": CRASH_MSG, "finished": NOW}
    d = dc.decide(observe(pods=pods(r3=over)))
    assert d.status.last_failure is not None and d.status.last_failure.message == "boom"


def _live(phase: str, step: int) -> str:
    """The live record a rank keeps in its termination-message file (flight.py)."""
    memory = {"peakRssBytes": 15 << 30, "limitBytes": 16 << 30}
    return json.dumps({"class": contract.LIVE, "rank": 6, "step": step, "exitCode": None,
                       "message": "", "phase": phase, "memory": memory})  # fmt: skip


def _oom_killed_in(phase: str, step: int = 811) -> dict[str, Any]:
    return {"phase": ob.PodPhase.FAILED, "exit_code": 137, "reason": "OOMKilled",
            "finished": NOW - 1, "message": _live(phase, step)}  # fmt: skip


@pytest.mark.parametrize(
    ("phase", "step", "likely"),
    [
        ("backward of block 11", 811, "activations: lower training.microBatchSize"),
        ("checkpoint save", 811, "full-state assembly or staging copies on save"),
        ("forward of block 0", 0, "the first gathered module is too large"),
        ("optimizer step", 811, "optimizer state"),
        ("initialization", None, "the model or optimizer state is built or loaded whole"),
    ],
)
def test_a_kernel_oom_kill_names_the_phase_the_rank_recorded(
    phase: str, step: int | None, likely: str
) -> None:
    """The kubelet reports the live record after a kernel OOM kill: the phase, the step and
    the memory reach status, with the article's likely cause."""
    d = dc.decide(observe(pods=pods(r3=_oom_killed_in(phase, step))))  # type: ignore[arg-type]
    f = d.failure
    assert f is not None and f.cause is st.Cause.OOM and f.phase == phase and f.step == step
    when = f"after step {step}" if step is not None else "before its first step"
    assert f.message == f"OOMKilled in {phase} {when} (last recorded: peak 15.0 of 16.0 GiB)"
    assert f.diagnosis.startswith(f"out of memory in {phase}: likely {likely}"), f.diagnosis
    assert d.status.phase is st.Phase.RESTARTING, "a first OOM is retried"


def test_a_second_oom_in_the_same_phase_stops_with_the_diagnosis() -> None:
    first = dc.decide(observe(pods=pods(r3=_oom_killed_in("backward of block 11"))))
    again = running_status(attempt=2, last_failure=first.status.last_failure)
    d = dc.decide(
        observe(status=again, pods=pods(attempt=2, r1=_oom_killed_in("backward of block 3")))
    )
    assert d.status.phase is st.Phase.FAILED and d.status.reason == "OOMKilled"
    assert d.status.message.startswith("OOMKilled twice in backward: out of memory in backward")
    assert d.launch is None and d.collect is not None, "the evidence is still kept"
    # another phase is another problem: retried
    save = dc.decide(
        observe(status=again, pods=pods(attempt=2, r1=_oom_killed_in("checkpoint save")))
    )
    assert save.status.phase is st.Phase.RESTARTING


def test_earliest_failed_pod_is_the_root_cause() -> None:
    late = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1}
    first = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 137,
        "reason": "OOMKilled",
        "finished": NOW - 5,
    }
    d = dc.decide(observe(pods=pods(r0=late, r2=first)))
    assert d.failure is not None and d.failure.cause is st.Cause.OOM and d.failure.rank == 2


def test_node_not_ready_within_grace_is_tolerated() -> None:
    d = dc.decide(observe(nodes=nodes(down={2: NOW - 10})))
    assert d.failure is None


def test_node_not_ready_past_grace_is_node_loss_with_force_delete() -> None:
    d = dc.decide(observe(nodes=nodes(down={2: NOW - 31})))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert d.failure.node == "node-2" and d.failure.time == NOW - 31
    forced = {x.name for x in d.delete if x.force}
    assert forced == {"job-a1-2"} and len(d.delete) == 4
    assert [e.node for e in d.status.excluded_nodes] == ["node-2"]
    assert d.status.restarts.infrastructure == 1 and d.status.restarts.application == 0


def test_a_node_silent_on_its_lease_is_lost_before_it_turns_not_ready() -> None:
    """Still Ready in the API, but its kubelet stopped renewing and the job made no step since
    (its collectives wait for the lost ranks): lost now, not after NotReady plus the grace: its
    pod is force-deleted, the node is excluded and counts as no capacity."""
    views = nodes()
    views[2] = dataclasses.replace(views[2], lease_silent_seconds=12.0, lease_quiet=True)
    stopped = running_status(last_progress_time=NOW - 13)
    d = dc.decide(observe(nodes=views, status=stopped, progress=ob.Progress(step=50)))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert d.failure.node == "node-2" and d.failure.time == NOW - 12.0
    assert "stopped renewing its Lease (12s) and the job made no step since" in d.failure.message
    assert {x.name for x in d.delete if x.force} == {"job-a1-2"}
    assert [e.node for e in d.status.excluded_nodes] == ["node-2"]
    assert d.status.restarts.infrastructure == 1 and d.status.restarts.application == 0
    assert observe(nodes=views).capacity(excluded=[]) == 3


def test_a_silent_lease_under_a_job_that_trains_on_is_no_loss_until_not_ready_past_grace() -> None:
    """A kubelet restarted or paused stops renewing while its pods train on: the operator saw
    step 51 after the node's last renewal, so the node is suspect, not lost, and the job is not
    restarted. NotReady past nodeLossGraceSeconds is a loss whatever the job does."""
    views = nodes()
    views[2] = dataclasses.replace(views[2], lease_silent_seconds=12.0, lease_quiet=True)
    d = dc.decide(observe(nodes=views, progress=ob.Progress(step=51)))
    assert d.failure is None and not d.delete and d.status.step == 51
    assert d.status.last_progress_time == NOW
    # Its steps stop (a real loss: the collectives wait for the lost ranks): lost once they
    # are late by three steps' worth (at least LIVE_WINDOW_SECONDS).
    stepped = running_status(last_progress_time=NOW - 2.0, step=51)
    assert dc.decide(observe(nodes=views, status=stepped, progress=None)).failure is None
    late = running_status(last_progress_time=NOW - dc.detect.LIVE_WINDOW_SECONDS - 0.1, step=51)
    d = dc.decide(observe(nodes=views, status=late, progress=None))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    down = nodes(down={2: NOW - 31})
    down[2] = dataclasses.replace(down[2], lease_silent_seconds=40.0, lease_quiet=True)
    d = dc.decide(observe(nodes=down, progress=ob.Progress(step=52)))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert "not Ready for 31s" in d.failure.message


def test_rank_0_is_scraped_every_second_while_a_node_of_the_gang_is_quiet() -> None:
    from fsdp_operator.io import probe
    from fsdp_operator.run import reconcile

    views = nodes()
    obs = observe(nodes=views, pods=pods(r0={"ip": "10.244.0.5"}))
    d = dc.decide(obs)
    calm = reconcile._probe_target(obs, d, max_interval=60.0)
    assert calm is not None and calm.every > probe.SUSPECT_INTERVAL
    views[2] = dataclasses.replace(views[2], lease_quiet=True)
    obs = observe(nodes=views, pods=pods(r0={"ip": "10.244.0.5"}))
    suspect = reconcile._probe_target(obs, dc.decide(obs), max_interval=60.0)
    assert suspect is not None and suspect.every == probe.SUSPECT_INTERVAL


def test_node_loss_beats_the_crashes_it_causes() -> None:
    crashed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1}
    d = dc.decide(observe(pods=pods(r0=crashed), nodes=nodes(down={2: NOW - 60})))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST


def test_vanished_pod_is_eviction() -> None:
    d = dc.decide(observe(pods=pods()[:3]))
    assert d.failure is not None and d.failure.cause is st.Cause.EVICTED and d.failure.rank == 3


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
    d = dc.decide(
        observe(status=resumed, pods=pods(attempt=2), progress=ob.Progress(step=reported))
    )
    assert d.status.step == shown and d.status.last_progress_time == progress_time


SCRAPED = ob.ScrapeHealth("job-a1-0", failures=0, address="10.0.0.5:9400")
"""The operator's scrapes reach rank 0 and get its metrics (no newer step in them)."""


def test_hang_after_progress_deadline() -> None:
    status = running_status(last_progress_time=NOW - 101)
    assert dc.decide(observe(status=status, progress=None, scrape=SCRAPED)).failure is None
    status = running_status(last_progress_time=NOW - 103)
    d = dc.decide(observe(status=status, progress=None, scrape=SCRAPED))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG and d.failure.rank == 0
    # useful work stopped at the last progress: detection took the deadline (and then some)
    assert d.failure.time == NOW - 103 and d.status.history[0].detect_seconds == 103
    # the pods' logs and evidence are read before they are deleted
    assert d.collect is not None and d.collect.hang and d.collect.attempt == 1
    assert [name for _, name, _ in d.collect.pods] == [p.name for p in pods()]
    assert d.status.history[0].failure is not None
    assert d.status.history[0].failure.cause is st.Cause.HANG


@pytest.mark.parametrize(
    ("ready", "hung"),
    [
        pytest.param(None, False, id="no-probe-result-yet"),
        pytest.param(True, False, id="probe-says-progress"),
        pytest.param(False, True, id="probe-says-none-is-evidence"),
    ],
)
def test_an_operator_that_has_not_scraped_yet_judges_no_hang_on_old_status(
    ready: bool | None, hung: bool
) -> None:
    """A replica that has just taken the lead (after a failover, or an API-server stall longer
    than its renew deadline) has no scrape of rank 0 yet, and the status's last step is as old
    as the stall: old news, not evidence. Its first scrape is due at once; only rank 0's
    readiness probe failing is evidence meanwhile."""
    status = running_status(last_progress_time=NOW - 300)
    d = dc.decide(
        observe(status=status, progress=None, scrape=None, pods=pods(r0={"ready": ready}))
    )
    assert (d.failure is not None and d.failure.cause is st.Cause.HANG) is hung, d.failure


def test_the_startup_deadline_allows_the_first_step_and_then_the_deadline_holds() -> None:
    """startupDeadlineSeconds 300 beside a progress deadline of 100: an attempt with no step
    yet is not hung at 250 s of running, it is at 303 s; once it has stepped, 100 s with no
    step is a hang again."""
    spec = make_spec(failurePolicy={"progressDeadlineSeconds": 100, "startupDeadlineSeconds": 300})
    status = running_status(last_progress_time=None)
    status.history[-1].timeline = st.Timeline(running=NOW - 250)
    assert (
        dc.decide(observe(spec=spec, status=status, progress=None, scrape=SCRAPED)).failure is None
    )
    status.history[-1].timeline = st.Timeline(running=NOW - 303)
    d = dc.decide(observe(spec=spec, status=status, progress=None, scrape=SCRAPED))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG, d.failure
    stepped = running_status(last_progress_time=NOW - 103)
    d = dc.decide(observe(spec=spec, status=stepped, progress=None, scrape=SCRAPED))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG, d.failure


def test_blind_a_readiness_drop_after_ready_is_judged_by_the_progress_deadline() -> None:
    """The operator cannot scrape rank 0, so it never sees a first step and its own window is
    the startup deadline (300 s). Rank 0's readiness probe applies both allowances itself:
    Ready, then not Ready again, is its verdict, taken at the progress deadline (100 s); never
    Ready yet is a start, judged at the startup deadline."""
    spec = make_spec(failurePolicy={"progressDeadlineSeconds": 100, "startupDeadlineSeconds": 300})

    def judged(running: float, changed: float) -> st.Failure | None:
        status = running_status(last_progress_time=None)
        status.history[-1].timeline = st.Timeline(running=NOW - running)
        rank0 = {"ready": False, "ready_changed": NOW - changed}
        obs = observe(spec=spec, status=status, progress=None, scrape=BLIND, pods=pods(r0=rank0))
        return dc.decide(obs).failure

    assert judged(running=50, changed=10) is None  # within the progress deadline of running
    hung = judged(running=150, changed=10)
    assert hung is not None and hung.cause is st.Cause.HANG, hung
    assert "within 100s (300s to a first)" in hung.message, hung.message
    assert judged(running=150, changed=160) is None  # never Ready: still starting
    late = judged(running=303, changed=310)
    assert late is not None and late.cause is st.Cause.HANG, late


def test_no_hang_while_steps_advance() -> None:
    status = running_status(last_progress_time=NOW - 101)
    d = dc.decide(observe(status=status, progress=ob.Progress(step=51)))
    assert d.failure is None and d.status.last_progress_time == NOW


BLIND = ob.ScrapeHealth(
    "job-a1-0", failures=3, error="GET http://10.0.0.5:9400/metrics: no answer within 1s",
    address="10.0.0.5:9400",
)  # fmt: skip


REFUSED = ob.ScrapeHealth(
    "job-a1-0", failures=0, error="GET http://10.0.0.5:9400/metrics: Connect call failed",
    address="10.0.0.5:9400", answered=False,
)  # fmt: skip


@pytest.mark.parametrize(
    ("scrape", "cause"),
    [
        pytest.param(REFUSED, st.Cause.RENDEZVOUS, id="never-served-the-gang-never-met"),
        pytest.param(dataclasses.replace(REFUSED, answered=True), st.Cause.HANG, id="served"),
    ],
)
def test_a_gang_that_never_met_is_not_the_users_hang(
    scrape: ob.ScrapeHealth | None, cause: st.Cause
) -> None:
    """Past the deadline with no step in the attempt: if rank 0 never served its metrics (the
    kit serves them once the process group is up; torchrun spawns it once the agents met),
    the attempt ends RendezvousTimeout, charged to the infrastructure budget and not to the
    no-progress breaker; otherwise a Hang, as before."""
    status = running_status(last_progress_time=None)
    status.history[-1].timeline = st.Timeline(running=NOW - 103)
    d = dc.decide(observe(status=status, progress=None, scrape=scrape))
    assert d.failure is not None and d.failure.cause is cause, d.failure
    restarts = d.status.restarts
    if cause is st.Cause.RENDEZVOUS:
        assert "the gang never met" in d.failure.message and "10.0.0.5:9400" in d.failure.message
        assert (restarts.infrastructure, restarts.application) == (1, 0)
        assert restarts.without_progress == 0
        assert _progress_condition(d) is None, "refused is no scrape failure"
    else:
        assert (restarts.infrastructure, restarts.application) == (0, 1)


def _progress_condition(d: dc.Decision) -> st.Condition | None:
    return next((c for c in d.status.conditions if c.type == dc.PROGRESS_OBSERVED), None)


@pytest.mark.parametrize(
    ("ready", "ready_changed", "hang_at"),
    [
        pytest.param(True, NOW - 150, None, id="ready-rank0-is-progress"),
        pytest.param(False, NOW - 2, NOW - 2 - 100, id="probe-says-stale"),
        pytest.param(None, None, NOW - 103, id="no-probe-verdict-as-today"),
    ],
)
def test_a_blind_scrape_is_no_evidence_rank0s_readiness_probe_is(
    ready: bool | None, ready_changed: float | None, hang_at: float | None
) -> None:
    """Where the operator's scrapes get no answer (a NetworkPolicy), its silence is missing
    data: a hang is declared only on the kubelet's verdict on rank 0's progress probe."""
    status = running_status(last_progress_time=NOW - 103)
    rank0 = {"ready": ready, "ready_changed": ready_changed}
    d = dc.decide(observe(status=status, progress=None, scrape=BLIND, pods=pods(r0=rank0)))
    cond = _progress_condition(d)
    assert cond is not None and cond.status == "False" and cond.reason == "ScrapeFailing"
    assert "10.0.0.5:9400" in cond.message and "no answer within 1s" in cond.message
    if hang_at is None:
        assert d.failure is None and d.status.phase is st.Phase.RUNNING
        assert "ProgressUnobserved" in [e.reason for e in d.events]
        return
    assert d.failure is not None and d.failure.cause is st.Cause.HANG
    assert d.failure.time == hang_at
    assert "readiness probe" in d.failure.message and "no answer within 1s" in d.failure.message


def test_the_progress_condition_turns_back_and_is_written_once_per_change() -> None:
    d = dc.decide(observe(scrape=BLIND, pods=pods(r0={"ready": True})))
    blind = _progress_condition(d)
    assert blind is not None and blind.status == "False"
    again = dc.decide(observe(status=d.status, scrape=dataclasses.replace(BLIND, failures=9),
                              pods=pods(r0={"ready": True})))  # fmt: skip
    assert again.status.conditions == d.status.conditions
    assert "ProgressUnobserved" not in [e.reason for e in again.events]
    one_miss = dataclasses.replace(BLIND, failures=1)
    assert dc.decide(observe(status=d.status, scrape=one_miss)).status.conditions == (
        d.status.conditions
    )
    back = dc.decide(observe(status=d.status, scrape=dataclasses.replace(BLIND, failures=0)))
    cond = _progress_condition(back)
    assert cond is not None and cond.status == "True" and cond.reason == "Scraped"


@pytest.mark.parametrize(
    ("over", "cause", "phase"),
    [
        ({"unschedulable": True, "node": None}, st.Cause.UNSCHEDULABLE, st.Phase.RESTARTING),
        ({"image_error": "ErrImagePull", "node": "node-3"}, st.Cause.IMAGE_PULL, st.Phase.FAILED),
    ],
)
def test_pending_past_timeout(over: dict[str, Any], cause: st.Cause, phase: st.Phase) -> None:
    status = running_status(phase=st.Phase.PENDING, attempt_started=NOW - 51)
    stuck = {"phase": ob.PodPhase.PENDING, **over}
    d = dc.decide(observe(status=status, pods=pods(r3=stuck)))
    assert d.failure is not None and d.failure.cause is cause and d.status.phase is phase


def test_pending_within_timeout_waits() -> None:
    status = running_status(phase=st.Phase.PENDING, attempt_started=NOW - 10)
    stuck = {"phase": ob.PodPhase.PENDING, "unschedulable": True, "node": None}
    d = dc.decide(observe(status=status, pods=pods(r3=stuck)))
    assert d.failure is None and d.launch is None


# --- recovery ------------------------------------------------------------------------------------


def test_crash_restarts_at_once_from_newest_checkpoint() -> None:
    failed = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 1,
        "finished": NOW - 2,
        "message": CRASH_MSG,
    }
    d = dc.decide(observe(pods=pods(r1=failed), checkpoint=ckpt(40)))
    assert d.launch == dc.Launch(attempt=2, replicas=4, resume_path="/ckpt/step-40")
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


def test_recovery_duration_recorded_when_new_attempt_runs() -> None:
    status = running_status(
        phase=st.Phase.RESTARTING,
        attempt=2,
        pods_created=False,
        failure_observed=NOW - 7,
        history=[st.HistoryEntry(attempt=2, started=NOW - 7, world_size=4)],
    )
    d = dc.decide(observe(status=status, pods=pods(attempt=2)))
    assert d.status.phase is st.Phase.RUNNING
    assert d.status.history[-1].recover_seconds == 7 and d.recovered is not None


def test_restart_without_new_checkpoint_backs_off_exponentially() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    delays = []
    for without in (0, 1):
        status = running_status(
            resumed_from_step=40,
            restarts=st.Restarts(total=without, application=without, without_progress=without),
        )
        d = dc.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(40)))
        delays.append(d.status.next_attempt_at)
    assert delays[0] is None  # first failure without progress: launched at once
    assert delays[1] == NOW + 10  # second: initialSeconds, then doubling
    spec = make_spec()
    assert restarts.backoff_seconds(spec, st.Restarts(without_progress=4)) == 40
    assert restarts.backoff_seconds(spec, st.Restarts(without_progress=9)) == 60


def test_backoff_wait_then_launch() -> None:
    status = running_status(phase=st.Phase.RESTARTING, next_attempt_at=NOW + 5)
    d = dc.decide(observe(status=status, pods=[]))
    assert d.launch is None and d.requeue_after == 5
    status = running_status(phase=st.Phase.RESTARTING, next_attempt_at=NOW - 1)
    d = dc.decide(observe(status=status, pods=[]))
    assert d.launch is not None and d.launch.attempt == 2


def test_progress_resets_the_circuit_breaker() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    status = running_status(resumed_from_step=40, restarts=st.Restarts(without_progress=2))
    d = dc.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(45)))
    assert d.status.restarts.without_progress == 0 and d.status.phase is st.Phase.RESTARTING


def test_circuit_breaker_fails_the_job() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    status = running_status(
        resumed_from_step=40, restarts=st.Restarts(total=2, application=2, without_progress=2)
    )
    d = dc.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(40)))
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.CIRCUIT_BREAKER
    assert d.launch is None and "maxRestartsWithoutProgress=3" in d.status.message


def test_application_budget_exhausted() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    status = running_status(restarts=st.Restarts(total=3, application=3))
    d = dc.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(60)))
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.BUDGET
    assert "maxRestarts=3" in d.status.message and d.status.finished == NOW


def test_infrastructure_failures_do_not_spend_the_application_budget() -> None:
    status = running_status(restarts=st.Restarts(total=3, application=3))
    d = dc.decide(observe(status=status, pods=pods(r0={"disrupted": True})))
    assert d.status.phase is st.Phase.RESTARTING
    assert d.status.restarts.application == 3 and d.status.restarts.infrastructure == 1
    assert d.status.restarts.without_progress == 0  # not the job's fault


def test_infrastructure_budget_exhausted() -> None:
    status = running_status(restarts=st.Restarts(total=5, infrastructure=5))
    d = dc.decide(observe(status=status, pods=pods(r0={"disrupted": True})))
    assert d.status.phase is st.Phase.FAILED and "maxInfraRestarts=5" in d.status.message


@pytest.mark.parametrize("code_over", [{"exit_code": 42}, {"message": CONFIG_MSG, "exit_code": 1}])
def test_non_retryable_fails_after_one_attempt(code_over: dict[str, Any]) -> None:
    failed = {"phase": ob.PodPhase.FAILED, "finished": NOW, **code_over}
    d = dc.decide(observe(pods=pods(r0=failed)))
    assert d.status.phase is st.Phase.FAILED and d.launch is None
    assert d.status.restarts.total == 0
    if "message" in code_over:  # the rank's own words reach the condition a user reads
        failed_condition = next(c for c in d.status.conditions if c.type == "Failed")
        assert failed_condition.message.endswith(": " + d.status.last_failure.message)
    kept = {x.name for x in d.delete}
    assert "job-a1-0" not in kept and len(kept) == 3  # the failed pod stays for its logs


# --- world size ---------------------------------------------------------------------------------


def test_shrink_to_what_the_ready_nodes_hold_after_node_loss() -> None:
    d = dc.decide(observe(nodes=nodes(down={3: NOW - 40})))
    # 3 nodes left; 3 does not divide 8 samples, so 2 is the largest exact size
    assert d.launch is not None and d.launch.replicas == 2 and d.status.world_size == 2
    assert d.launch.excluded_nodes == ("node-3",)


def test_unschedulable_always_shrinks_even_if_capacity_looks_fine() -> None:
    status = running_status(phase=st.Phase.PENDING, attempt_started=NOW - 60)
    stuck = {"phase": ob.PodPhase.PENDING, "unschedulable": True, "node": None}
    d = dc.decide(observe(status=status, pods=pods(r3=stuck)))
    assert d.launch is not None and d.launch.replicas == 2


def test_never_below_min_replicas() -> None:
    d = dc.decide(observe(nodes=nodes(down={1: NOW - 40, 2: NOW - 40, 3: NOW - 40})))
    assert d.launch is not None and d.launch.replicas == 2  # minReplicas, will wait Pending


def test_grow_back_when_capacity_returns_is_a_planned_drain() -> None:
    status = running_status(replicas=2, world_size=2)
    d = dc.decide(observe(status=status, pods=pods(n=2)))
    assert d.status.phase is st.Phase.RESTARTING and d.status.reason == st.Cause.RESIZE
    assert d.status.drain and d.launch is None and {x.grace_seconds for x in d.delete} == {None}
    assert d.status.restarts.total == 0  # planned restarts cost no budget


def test_a_resize_that_came_out_no_larger_is_not_retried_at_once() -> None:
    """The capacity estimate said 4 pods fit, the attempt after the Resize launched 2 (what
    really fit at launch): growing again is held off for GROW_RETRY_SECONDS, not looped."""
    resized = st.HistoryEntry(attempt=1, started=NOW - 90, ended=NOW - 30, cause=st.Cause.RESIZE,
                              world_size=2)  # fmt: skip
    current = st.HistoryEntry(attempt=2, started=NOW - 30, world_size=2)
    status = running_status(replicas=2, world_size=2, attempt=2, attempt_started=NOW - 30,
                            history=[resized, current])  # fmt: skip
    d = dc.decide(observe(status=status, pods=pods(n=2, attempt=2)))
    assert d.status.phase is st.Phase.RUNNING and not d.delete and not d.status.drain
    later = status.model_copy(update={"attempt_started": NOW - dc.GROW_RETRY_SECONDS - 1})
    d = dc.decide(observe(status=later, pods=pods(n=2, attempt=2)))
    assert d.status.reason == st.Cause.RESIZE and d.status.drain  # tried again, later


def test_no_resize_once_the_last_step_is_reached() -> None:
    # The pods are sealing the final checkpoint; growing now would start an empty attempt.
    status = running_status(replicas=2, world_size=2, step=100)
    spec = make_spec(training={"globalBatchSize": 8, "microBatchSize": 1, "steps": 100})
    d = dc.decide(observe(spec=spec, status=status, pods=pods(n=2), progress=ob.Progress(step=100)))
    assert d.status.phase is st.Phase.RUNNING and not d.delete and not d.status.drain


def test_drain_waits_for_old_pods_to_save_then_launches_at_full_size() -> None:
    status = running_status(
        phase=st.Phase.RESTARTING,
        replicas=2,
        drain=True,
        next_attempt_at=NOW,
        failure_observed=NOW - 3,
    )
    deleting = pods(n=2, r0={"deleting": True}, r1={"deleting": True})
    d = dc.decide(observe(status=status, pods=deleting))
    assert d.launch is None and d.requeue_after == 1.0
    d = dc.decide(observe(status=status, pods=[], checkpoint=ckpt(52)))
    assert d.launch == dc.Launch(attempt=2, replicas=4, resume_path="/ckpt/step-52")


def test_excluded_node_does_not_count_as_capacity() -> None:
    excluded = [st.ExcludedNode(node="node-3", until=NOW + 100)]
    status = running_status(replicas=2, world_size=2, excluded_nodes=excluded)
    d = dc.decide(observe(status=status, pods=pods(n=2)))
    assert d.launch is None and not d.delete  # 3 usable nodes: 2 is still the best size


def test_replicas_edit_down_is_applied_by_a_planned_restart() -> None:
    spec = make_spec(replicas=2, minReplicas=1)
    d = dc.decide(observe(spec=spec, generation=2))
    assert d.status.reason == st.Cause.RESIZE and d.status.observed_generation == 2
    # each condition says which spec it was set for, as Kubernetes' own conditions do
    assert {c.type: c.observed_generation for c in d.status.conditions} == {
        "Complete": 2, "Failed": 2, "Progressing": 2, "Suspended": 2
    }  # fmt: skip


# --- lifecycle ----------------------------------------------------------------------------------


def test_success_when_every_pod_exits_zero() -> None:
    done = {"phase": ob.PodPhase.SUCCEEDED, "exit_code": 0}
    d = dc.decide(observe(pods=pods(**{f"r{r}": done for r in range(4)})))
    assert d.status.phase is st.Phase.SUCCEEDED and not d.delete and d.launch is None


def test_suspend_drains_then_resume_launches_next_attempt() -> None:
    d = dc.decide(observe(spec=make_spec(suspend=True)))
    assert d.status.phase is st.Phase.SUSPENDED and len(d.delete) == 4 and d.status.drain
    suspended = d.status
    d = dc.decide(observe(spec=make_spec(suspend=True), status=suspended, pods=[]))
    assert not d.delete and d.launch is None
    d = dc.decide(observe(status=suspended, pods=[], checkpoint=ckpt(50)))
    assert d.launch == dc.Launch(attempt=2, replicas=4, resume_path="/ckpt/step-50")
    assert d.status.restarts.total == 0


def test_active_deadline_fails_and_tears_down() -> None:
    spec = make_spec(activeDeadlineSeconds=100)
    d = dc.decide(observe(spec=spec))
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.DEADLINE
    assert len(d.delete) == 4


def test_ttl_after_finished_deletes_the_job() -> None:
    spec = make_spec(ttlSecondsAfterFinished=60)
    status = running_status(phase=st.Phase.SUCCEEDED, finished=NOW - 30)
    d = dc.decide(observe(spec=spec, status=status))
    assert not d.delete_job and d.requeue_after == 30
    d = dc.decide(observe(spec=spec, status=status, now=NOW + 31))
    assert d.delete_job


def test_invalid_spec_fails_without_pods() -> None:
    d = dc.decide(
        observe(status=st.FSDPJobStatus(), pods=[], spec_error="template: volume at /ckpt")
    )
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.INVALID_SPEC
    assert d.launch is None and "volume at /ckpt" in d.status.message


def test_terminal_job_stays_terminal() -> None:
    status = running_status(phase=st.Phase.FAILED)
    d = dc.decide(observe(status=status, pods=pods(r0={"phase": ob.PodPhase.FAILED})))
    assert d.status.phase is st.Phase.FAILED and d.launch is None and not d.delete


def test_stale_pods_of_old_attempts_are_deleted() -> None:
    status = running_status(attempt=2)
    d = dc.decide(observe(status=status, pods=[*pods(attempt=2), *pods(attempt=1, n=1)]))
    assert [x.name for x in d.delete] == ["job-a1-0"]


def test_corrupt_checkpoint_quarantined_once() -> None:
    d = dc.decide(observe(corrupt_checkpoints=["/ckpt/step-60"]))
    assert d.quarantine == ["/ckpt/step-60"] and d.status.quarantined == ["/ckpt/step-60"]
    d2 = dc.decide(observe(status=d.status, corrupt_checkpoints=["/ckpt/step-60"]))
    assert d2.quarantine == []


def test_decision_is_deterministic() -> None:
    obs = observe(nodes=nodes(down={2: NOW - 31}))
    a, b = dc.decide(obs), dc.decide(obs)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)


def test_wakes_when_a_node_grace_period_ends_not_at_the_next_poll() -> None:
    d = dc.decide(observe(nodes=nodes(down={2: NOW - 28})))
    assert d.failure is None and d.requeue_after == pytest.approx(2.05)


# --- ownership: what the job does not own ------------------------------------------------------

SQUATTER = ob.Conflict(ob.ConflictKind.FOREIGN, "pod job-a1-0", "no controller")
OLD_POD = ob.Conflict(ob.ConflictKind.PREVIOUS_JOB, "pod job-a1-0", "FSDPJob job uid old")
OLD_CKPT = ob.Conflict(ob.ConflictKind.CHECKPOINTS, "checkpoint ./step-5", "FSDPJob uid old")


def _conflict(d: dc.Decision) -> st.Condition | None:
    return next((c for c in d.status.conditions if c.type == dc.CONFLICT), None)


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
    fresh = observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None,
                    conflicts=[conflict])  # fmt: skip
    d = dc.decide(fresh)
    cond = _conflict(d)
    assert d.launch is None and d.status.attempt == 0 and d.status.phase is st.Phase.PENDING
    assert cond is not None and cond.status == "True" and cond.reason == conflict.kind.value
    assert conflict.what in cond.message and says in cond.message
    assert [e.reason for e in d.events] == [conflict.kind.value]
    assert d.requeue_after == dc.CONFLICT_POLL_SECONDS
    again = dc.decide(dataclasses.replace(fresh, status=d.status))
    assert again.events == []  # the Event is posted once, not every pass


def test_missing_pods_are_not_created_over_a_squatter_then_are_once_it_is_gone() -> None:
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    d = dc.decide(observe(status=status, pods=pods(n=3), conflicts=[SQUATTER]))
    assert d.launch is None and _conflict(d) is not None
    cleared = dc.decide(observe(status=d.status, pods=pods(n=3)))
    assert cleared.launch == dc.Launch(attempt=1, replicas=4, resume_path="")
    cond = _conflict(cleared)
    assert cond is not None and cond.status == "False" and cond.reason == "Resolved"


def test_pods_the_operator_takes_back_from_a_half_made_gang_are_not_a_failure() -> None:
    """A create met a name someone else holds after other ranks were created: the operator
    deletes those again. While the squatter stays, the job waits whole: no restart, no
    Evicted, nothing launched."""
    status = running_status(phase=st.Phase.PENDING, pods_created=False)
    taken_back = pods(n=3, r1={"deleting": True}, r2={"deleting": True})[1:]
    d = dc.decide(observe(status=status, pods=taken_back, conflicts=[SQUATTER]))
    assert d.failure is None and d.launch is None and d.delete == []
    assert d.status.attempt == 1 and d.status.restarts.total == 0
    assert d.status.phase is st.Phase.PENDING and _conflict(d) is not None


def test_dry_run_result_is_remembered_per_generation() -> None:
    d = dc.decide(observe(generation=3, validated_generation=3))
    assert d.status.validated_generation == 3
    later = dc.decide(observe(status=d.status, generation=4))
    assert later.status.validated_generation == 3  # generation 4 is dry-run on the next pass


def test_a_working_pass_clears_the_reconcile_error_condition() -> None:
    failing = st.Condition(type=dc.RECONCILE_ERROR, status="True", reason="ApiException",
                           message="boom", last_transition_time="2026-12-01T00:00:00Z")  # fmt: skip
    d = dc.decide(observe(status=running_status(conditions=[failing])))
    assert all(c.type != dc.RECONCILE_ERROR for c in d.status.conditions)


# --- checkpoints the operator cannot read: the pods choose, under its rules -------------------

CRASHED = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 2, "message": CRASH_MSG}


def _rules(d: dc.Decision) -> contract.ResumeRules:
    assert d.launch is not None and d.launch.resume_path == contract.RESUME_AUTO
    return contract.ResumeRules.parse(d.launch.resume_rules)


def test_a_blind_operator_restarts_into_auto_with_its_lineage_and_the_sealed_step() -> None:
    # The chart's default: no checkpoint mount in the operator. Rank 0 reported step 40 sealed.
    seen = ob.Progress(step=50, checkpoint_step=40)
    obs = observe(pods=pods(r1=CRASHED), checkpoint=None, checkpoints_visible=False, progress=seen)
    d = dc.decide(obs)
    assert _rules(d) == contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40)
    assert d.status.sealed_step == 40 and d.status.resume_path == "auto"
    assert d.status.resumed_from_step is None  # known once its pods say which one they loaded
    started = [e.message for e in d.events if e.reason == "AttemptStarted"]
    assert started == [
        "attempt 2: 4 pods from the checkpoint its pods choose (the operator cannot read them, "
        "expecting step 40)"
    ]


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
    d = dc.decide(dataclasses.replace(obs, checkpoints_visible=False))
    assert d.status.resumed_from_step == 40 and d.status.history[-1].resumed_from_step == 40
    assert [e.message for e in d.events if e.reason == "Resumed"] == [
        "attempt 2: its pods resumed from step 40"
    ]


def _pods_report(seen: ob.Progress) -> dc.Decision:
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
    return dc.decide(dataclasses.replace(obs, checkpoints_visible=False))


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
    assert len(behind) == 1 and behind[0].type is dc.EventType.WARNING
    assert "step 40 was sealed before the restart" in behind[0].message
    assert "resumed from step 20" in behind[0].message and "steps 21-40 again" in behind[0].message
    assert d.status.history[0].steps_lost == 22
    d = _pods_report(ob.Progress(step=41, resumed_from=40))  # what it was sent to find
    assert "ResumedBehind" not in [e.reason for e in d.events]


def test_an_attempt_that_never_said_where_it_resumed_bounds_the_next_lineage() -> None:
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40).to_json()
    status = running_status(attempt=2, resume_path="auto", resume_rules=rules, sealed_step=40)
    crashed = pods(attempt=2, r0=CRASHED)
    obs = observe(status=status, pods=crashed, checkpoint=None, progress=None)
    obs = dataclasses.replace(obs, checkpoints_visible=False)
    assert _rules(dc.decide(obs)) == contract.ResumeRules(
        attempt=2, resumed_from_step=40, expect_step=40
    )


def test_a_sealed_step_the_operator_cannot_find_is_never_a_fresh_start() -> None:
    # It reads the directory, finds nothing usable, yet step 40 was sealed: the pods must find
    # it (or stop and say why), not train again from 0.
    status = running_status(sealed_step=40)
    d = dc.decide(observe(status=status, pods=pods(r1=CRASHED), checkpoint=None, progress=None))
    assert _rules(d) == contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40)


@pytest.mark.parametrize(
    ("visible", "attempt_over"),
    [(True, {}), (True, {"status": st.FSDPJobStatus(), "pods": []})],
    ids=["nothing-sealed-and-seen-empty", "first-attempt-seen-empty"],
)
def test_a_fresh_start_where_it_is_right(visible: bool, attempt_over: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"pods": pods(r1=CRASHED), "progress": None, **attempt_over}
    d = dc.decide(observe(checkpoint=None, checkpoints_visible=visible, **fields))
    assert d.launch is not None and d.launch.resume_path == "" and d.launch.resume_rules == ""


def test_a_blind_first_attempt_chooses_too() -> None:
    # The operator cannot see what the job's directory holds: another job's checkpoints there
    # (the same name, deleted and created again) must stop it, or be resumed from with
    # resumeFromPreviousJobs, as when it reads them; a fresh "" would train over them.
    obs = observe(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None)
    d = dc.decide(dataclasses.replace(obs, checkpoints_visible=False))
    assert d.launch is not None and d.launch.resume_path == contract.RESUME_AUTO
    assert _rules(d) == contract.ResumeRules(attempt=0, resumed_from_step=None)


def test_a_blind_operator_takes_new_checkpoints_from_rank_0s_report() -> None:
    # Attempt 2 chose step 40 itself, then sealed 45: that is progress, so a crash after it is
    # not one "without progress" (the circuit breaker would otherwise stop a healthy job).
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=40).to_json()
    restarts = st.Restarts(total=1, application=1, without_progress=1)
    status = running_status(
        attempt=2,
        resume_path="auto",
        resume_rules=rules,
        sealed_step=40,
        resumed_from_step=40,
        restarts=restarts,
    )
    seen = ob.Progress(step=46, checkpoint_step=45)
    obs = observe(status=status, pods=pods(attempt=2, r1=CRASHED), checkpoint=None, progress=seen)
    d = dc.decide(dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/job"))
    assert d.status.last_checkpoint is not None
    assert (d.status.last_checkpoint.step, d.status.last_checkpoint.path) == (
        45,
        "/ckpt/job/step-45",
    )
    assert d.status.restarts.without_progress == 0 and d.status.sealed_step == 45
    assert _rules(d) == contract.ResumeRules(attempt=2, resumed_from_step=40, expect_step=45)


def test_checkpoints_the_pods_set_aside_are_kept_and_said_once() -> None:
    # The operator cannot read the claim: rank 0 quarantined step 45 when it chose, and says so.
    page = "\n".join([
        "# TYPE fsdp_checkpoint_quarantined gauge",
        'fsdp_checkpoint_quarantined{step="45"} 1.0',
        "fsdp_train_step 41",
    ])  # fmt: skip
    seen = observe_mod.progress_of(kube.contract_samples(page))
    assert seen.quarantined == (45,)
    status = running_status(attempt=2, resume_path="auto")
    obs = observe(status=status, pods=pods(attempt=2), checkpoint=None, progress=seen)
    obs = dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/llama")
    d = dc.decide(obs)
    assert d.status.quarantined == ["/ckpt/llama/step-45"] and d.quarantine == []
    said = [e.message for e in d.events if e.reason == "CheckpointQuarantined"]
    assert said == ["/ckpt/llama/step-45 failed verification; attempt 2's rank 0 set it aside"]
    again = dc.decide(dataclasses.replace(obs, status=d.status))
    assert not [e for e in again.events if e.reason == "CheckpointQuarantined"]


def test_a_finished_job_shows_where_rank_0_finished_not_its_last_scrape() -> None:
    # The last scrape saw step 199 of 300; the operator reads no claim. Rank 0's completion
    # report is the only word on the end (seen on the chart's default install).
    done = json.dumps({"class": contract.COMPLETED, "rank": 0, "step": 300, "exitCode": 0,
                       "message": contract.completion_message(sealed_step=300)})  # fmt: skip
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    status = running_status(step=199, resume_path="auto")
    obs = observe(status=status, pods=pods(**finished), checkpoint=None, progress=None)
    obs = dataclasses.replace(obs, checkpoints_visible=False, checkpoint_dir="/ckpt/llama")
    d = dc.decide(obs)
    assert d.status.phase is st.Phase.SUCCEEDED and d.status.step == 300
    assert d.status.last_checkpoint is not None
    assert (d.status.last_checkpoint.step, d.status.last_checkpoint.path) == (
        300,
        "/ckpt/llama/step-300",
    )
    assert d.status.sealed_step == 300


def test_rank_0s_final_sums_count_the_steps_after_the_last_scrape() -> None:
    # The last scrape saw 40 steps in 8 s; rank 0 ran 50 in 10 s before it exited: goodput
    # counts all 50 (an attempt's last seconds were "Other" before).
    sums = contract.sums(steps_run=50, train_seconds=10.0, blocked_seconds=0.75)
    done = json.dumps({"class": contract.COMPLETED, "rank": 0, "step": 60, "exitCode": 0,
                       "message": contract.completion_message(sealed_step=60),
                       contract.SUMS: sums})  # fmt: skip
    history = [st.HistoryEntry(attempt=1, started=NOW - 20, world_size=4, steps_run=40,
                               train_seconds=8.0, blocked_seconds=0.5)]  # fmt: skip
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    obs = observe(status=running_status(step=50, history=history), pods=pods(**finished))
    d = dc.decide(obs)
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
    sums = contract.sums(steps_run=50, train_seconds=10.0, blocked_seconds=0.0,
                         milestones={**reached, "bogus": 1.0})  # fmt: skip
    assert contract.parse_milestones({contract.SUMS: sums}) == reached
    assert "milestones" not in contract.totals(sums)
    done = json.dumps({"class": contract.COMPLETED, "rank": 0, "step": 60, "exitCode": 0,
                       "message": contract.completion_message(sealed_step=60),
                       contract.SUMS: sums})  # fmt: skip
    tl = st.Timeline(cause=st.Cause.CRASH, failed=t0 - 2, detected=t0 - 1, gang_gone=t0 + 1,
                     launched=t0 + 0.5, scheduled=t0 + 1.5, running=t0 + 3)  # fmt: skip
    crash = st.Failure(cause=st.Cause.CRASH, rank=1, time=t0 + 4)
    history = [st.HistoryEntry(attempt=2, started=t0, world_size=4, timeline=tl,
                               restarts_in_place=[st.InPlaceRestart(generation=0, failure=crash)]
                               if in_place else [])]  # fmt: skip
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"] = {"phase": ob.PodPhase.SUCCEEDED, "message": done}
    status = running_status(attempt=2, step=12, history=history)
    d = dc.decide(observe(status=status, pods=pods(attempt=2, **finished)))
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
)  # fmt: skip
def test_malformed_final_milestones_are_ignored(milestones: object) -> None:
    sums = {"stepsRun": 5, "trainSeconds": 1.0, "blockedSeconds": 0, "milestones": milestones}
    assert contract.parse_milestones({contract.SUMS: sums}) == {}
    assert contract.parse_milestones("not a message") == {}


def test_a_crashed_rank_0s_live_record_sums_count_and_older_sums_never_lower_the_scrape() -> None:
    sums = contract.sums(steps_run=33, train_seconds=6.6, blocked_seconds=0.0)
    live = {"class": contract.LIVE, "rank": 0, "step": 33, "exitCode": None, "message": "",
            contract.SUMS: sums}  # fmt: skip
    history = [st.HistoryEntry(attempt=1, started=NOW - 20, world_size=4, steps_run=30,
                               train_seconds=6.0)]  # fmt: skip
    killed = {"phase": ob.PodPhase.FAILED, "exit_code": 137, "reason": "OOMKilled",
              "finished": NOW - 1, "message": json.dumps(live)}  # fmt: skip
    d = dc.decide(observe(status=running_status(history=history), pods=pods(r0=killed)))
    entry = d.status.history[0]
    assert entry.cause is st.Cause.OOM and (entry.steps_run, entry.train_seconds) == (33, 6.6)
    stale = dict(live, **{contract.SUMS: contract.sums(steps_run=20, train_seconds=4.0,
                                                       blocked_seconds=0.0)})  # fmt: skip
    killed["message"] = json.dumps(stale)
    d = dc.decide(observe(status=running_status(history=history), pods=pods(r0=killed)))
    assert (d.status.history[0].steps_run, d.status.history[0].train_seconds) == (30, 6.0)


def test_sums_of_a_gang_this_operator_tore_down_reach_the_closed_attempt() -> None:
    # Rank 1 crashed; the operator deleted the gang and attempt 2 runs. Rank 0's SIGTERM
    # message (its totals: 47 steps, not the 40 scraped) arrives only now.
    sums = contract.sums(steps_run=47, train_seconds=9.4, blocked_seconds=3.0)
    stopped = {"class": contract.LIVE, "rank": 0, "step": 47, "exitCode": None, "message": "",
               contract.SUMS: sums}  # fmt: skip
    closed = st.HistoryEntry(attempt=1, started=NOW - 60, ended=NOW - 10, world_size=4,
                             cause=st.Cause.CRASH, steps_run=40, train_seconds=8.0,
                             blocked_seconds=0.5)  # fmt: skip
    current = st.HistoryEntry(attempt=2, started=NOW - 8, world_size=4)
    status = running_status(attempt=2, history=[closed, current], step=45)
    gone = {"phase": ob.PodPhase.FAILED, "exit_code": 143, "deleting": True,
            "message": json.dumps(stopped)}  # fmt: skip
    old = [p for p in pods(attempt=1, r0=gone) if p.rank == 0]
    d = dc.decide(observe(status=status, pods=[*old, *pods(attempt=2)]))
    first, second = d.status.history
    assert (first.steps_run, first.train_seconds) == (47, 9.4)
    assert first.blocked_seconds == 0.5, "a save after the stop is the recovery's time"
    assert first.ended == NOW - 10 and first.cause is st.Cause.CRASH
    assert second.steps_run is None
    # the same while the job waits to launch attempt 2 (the old gang still draining)
    status = running_status(phase=st.Phase.RESTARTING, history=[closed], drain=True,
                            next_attempt_at=NOW, failure_observed=NOW - 3)  # fmt: skip
    d = dc.decide(observe(status=status, pods=[*old, *pods(n=4)[1:]]))
    assert (d.status.history[0].steps_run, d.status.history[0].train_seconds) == (47, 9.4)


@pytest.mark.parametrize(
    "sums",
    [None, "x", {"stepsRun": "5", "trainSeconds": 1.0, "blockedSeconds": 0},
     {"stepsRun": True, "trainSeconds": 1.0, "blockedSeconds": 0},
     {"stepsRun": 5, "trainSeconds": -1.0, "blockedSeconds": 0},
     {"stepsRun": 5, "trainSeconds": 1.0}],
)  # fmt: skip
def test_malformed_sums_are_ignored(sums: object) -> None:
    assert contract.parse_sums({contract.SUMS: sums}) is None


def test_a_completion_report_that_does_not_parse_changes_nothing() -> None:
    finished = {f"r{r}": {"phase": ob.PodPhase.SUCCEEDED} for r in range(4)}
    finished["r0"]["message"] = '{"class": "Completed", "step": "x", "message": "{oops"}'
    obs = observe(status=running_status(step=199), pods=pods(**finished), progress=None)
    d = dc.decide(obs)
    assert d.status.phase is st.Phase.SUCCEEDED and d.status.step == 199


def test_the_newest_five_failed_attempts_keep_their_evidence() -> None:
    """Attempt 7 fails after six failures with evidence (1-6): attempts 1 and 2 lose theirs
    (their ConfigMaps are deleted in this pass) and say so in history."""

    def failed(n: int) -> st.HistoryEntry:
        why = st.Failure(cause=st.Cause.CRASH, time=NOW - 100 + n, evidence_ref=f"job-a{n}-why")
        return st.HistoryEntry(attempt=n, world_size=4, ended=NOW - 99 + n, cause=why.cause,
                               failure=why)  # fmt: skip

    history = [failed(n) for n in range(1, 7)]
    history.append(st.HistoryEntry(attempt=7, started=NOW - 50, world_size=4))
    status = running_status(attempt=7, history=history)
    crashed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1}
    d = dc.decide(observe(status=status, pods=pods(attempt=7, r1=crashed)))
    assert d.collect is not None and d.collect.attempt == 7 and d.collect.drop == (1, 2)
    kept = {h.attempt: h.failure.evidence_ref for h in d.status.history if h.failure}
    assert kept[1] is None and kept[2] is None and kept[3] == "job-a3-why"


def test_a_cuda_out_of_memory_error_comes_with_the_allocators_view() -> None:
    gib = 1 << 30
    doc = {"class": "OutOfMemory", "rank": 3, "step": 40, "exitCode": 1,
           "message": "CUDA out of memory. Tried to allocate 2.00 GiB", "phase": "optimizer step",
           "memory": {"cudaAllocatedBytes": 15 * gib, "cudaTotalBytes": 16 * gib},
           "ledger": {"persistentBytesPerRank": 12 * gib, "largestGatheredBytes": gib}}  # fmt: skip
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1,
              "message": json.dumps(doc)}  # fmt: skip
    f = dc.decide(observe(pods=pods(r3=failed))).failure
    assert f is not None and f.cause is st.Cause.OOM and f.phase == "optimizer step"
    assert f.message == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert f.diagnosis == (
        "out of memory in optimizer step: likely optimizer state: more replicas shard it "
        "thinner, or a lighter optimizer (allocated 15.0 of 16.0 GiB: persistent shards 12.0, "
        "largest gathered block 1.0, the rest (activations, temporaries) 2.0 GiB)"
    )


def test_a_lost_nodes_pods_logs_are_not_asked_for() -> None:
    """Its kubelet cannot answer: the read would only wait out its timeout before the restart."""
    d = dc.decide(observe(nodes=nodes(down={2: NOW - 31})))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert d.collect is not None and d.collect.unreadable == (2,)


# --- restarts in place (failurePolicy.inPlaceRestarts; fsdp_worker.keeper.gang) -------------------


def _in_place_record(
    generation: int, *, node: int = 2, step: int = 48, **over: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "class": contract.FailureClass.RUNTIME.value,
        "rank": node,
        "step": step,
        "exitCode": 1,
        "message": "CUDA error: an illegal memory access",
        "node": node,
        "torchrunExitCode": 1,
        "time": NOW - 8,
        "generation": generation,
    }
    doc.update(over)
    return doc


def _in_place_progress(generation: int, *records: dict[str, Any], **over: Any) -> ob.Progress:
    fields: dict[str, Any] = {
        "step": 45,
        "generation": generation,
        "restarts_in_place": records,
        "resumed_from": 40,
        "milestones": {"rendezvous": NOW - 5, "loaded": NOW - 3, "first_step": NOW - 2},
        "steps_run": 5,
        "train_seconds": 5.0,
    }
    fields.update(over)
    return ob.Progress(**fields)


def _in_place_spec(**policy_over: Any) -> api.FSDPJobSpec:
    spec = make_spec()
    policy = spec.failure_policy.model_copy(update={"in_place_restarts": 3, **policy_over})
    return spec.model_copy(update={"failure_policy": policy})


def test_a_restart_in_place_is_charged_and_kept_without_touching_the_pods() -> None:
    before = running_status()
    before.history[-1].steps_run, before.history[-1].train_seconds = 48, 48.0
    obs = observe(
        spec=_in_place_spec(), status=before, progress=_in_place_progress(1, _in_place_record(0))
    )
    d = dc.decide(obs)
    s = d.status
    assert d.launch is None and d.delete == [] and s.phase is st.Phase.RUNNING and s.attempt == 1
    assert (s.restarts.application, s.restarts.total, s.reliability.failures) == (1, 1, 1)
    assert s.last_failure is not None and s.last_failure.cause is st.Cause.CRASH
    assert s.last_failure.pod == "job-a1-2" and s.last_failure.step == 48
    (restart,) = s.history[-1].restarts_in_place
    assert (restart.generation, restart.resumed_from_step, restart.steps_lost) == (0, 40, 8)
    assert restart.resumed == NOW - 2 and restart.steps_run == 48
    assert (restart.rendezvous, restart.loaded) == (NOW - 5, NOW - 3)  # the phases
    # Rank 0's counters started again in generation 1: the entry keeps both generations'.
    assert s.history[-1].steps_run == 53 and s.history[-1].train_seconds == 53.0
    (event,) = [e for e in d.events if e.reason == "RestartedInPlace"]
    assert "generation 1 of attempt 1" in event.message and "rank 2 pod job-a1-2" in event.message
    assert d.in_place == [restart] and d.failure is s.last_failure
    # Seen again in the next pass: not charged twice.
    again = dc.decide(dataclasses.replace(obs, status=s))
    assert again.status.restarts.application == 1
    assert not [e for e in again.events if e.reason == "RestartedInPlace"]
    # Goodput charges the crash its recovery (failure to the next first step) and 8 redone steps.
    lost = again.status.goodput.lost_seconds if again.status.goodput else {}
    assert lost.get("Crash") == pytest.approx(6.0 + 8.0)


def test_an_oom_kill_seen_by_the_keeper_is_charged_as_oom() -> None:
    record = _in_place_record(
        0, **{"class": contract.LIVE, "reason": "OOMKilled", "phase": "forward"}
    )
    d = dc.decide(observe(spec=_in_place_spec(), progress=_in_place_progress(1, record)))
    assert d.status.last_failure is not None and d.status.last_failure.cause is st.Cause.OOM
    assert d.status.history[-1].restarts_in_place[0].failure.phase == "forward"


def test_a_restart_in_place_past_the_budget_fails_the_job() -> None:
    spec = _in_place_spec()
    spec = spec.model_copy(
        update={"failure_policy": spec.failure_policy.model_copy(update={"max_restarts": 1})}
    )
    status = running_status(restarts=st.Restarts(total=1, application=1))
    d = dc.decide(
        observe(spec=spec, status=status, progress=_in_place_progress(1, _in_place_record(0)))
    )
    assert d.status.phase is st.Phase.FAILED
    assert "maxRestarts=1" in d.status.conditions[-1].message or any(
        "maxRestarts=1" in e.message for e in d.events
    )
    assert {p.name for p in d.delete} == {f"job-a1-{r}" for r in range(4)}


def test_pods_carry_the_keeper_only_when_restarts_in_place_are_allowed() -> None:
    from fsdp_operator.render import templates

    job = templates.JobRef(namespace="ns", name="job", uid="u1")
    launch = dc.Launch(attempt=2, replicas=2, resume_path="")
    plain = templates.worker_pod(job, make_spec(), launch, node_rank=1)
    kept = templates.worker_pod(job, _in_place_spec(), launch, node_rank=1)
    (c_plain,), (c_kept,) = plain["spec"]["containers"], kept["spec"]["containers"]
    assert c_plain["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert c_kept["command"][:3] == ["python", "-m", "fsdp_worker.keeper.gang"]
    assert c_kept["command"][3:] == c_plain["command"]
    env = {e["name"]: e.get("value") for e in c_kept["env"]}
    gang = json.loads(env[contract.ENV_GANG])
    assert gang == {
        "restarts": 3,
        "coordinator": "job-a2-0.job-workers.ns.svc.cluster.local:29501",
        "node": 1,
        "nodes": 2,
        "nonRetryable": [42],
    }
    assert contract.ENV_GANG not in {e["name"] for e in c_plain["env"]}
    assert {"name": "gang", "containerPort": 29501, "protocol": "TCP"} in c_kept["ports"]


def test_rank_0s_in_place_records_are_read_from_its_metrics() -> None:
    """What the worker serves (metrics.restarts_in_place, as gang.py's env sets it) is what
    the operator reads; a record that is not JSON is left out."""
    import prometheus_client as prom

    from fsdp_worker.telemetry import metrics

    record = _in_place_record(0)
    registry = prom.CollectorRegistry()
    env = {contract.ENV_GENERATION: "1", contract.ENV_RESTARTS_IN_PLACE: json.dumps([record, 7])}
    metrics.restarts_in_place(registry, env)
    text = prom.generate_latest(registry).decode()
    text += 'fsdp_worker_restart_in_place{record="not json"} 1.0\n'
    prog = observe_mod.progress_of(kube.contract_samples(text))
    assert prog.generation == 1 and prog.restarts_in_place == (record,)


def test_with_restarts_in_place_the_operators_hang_waits_for_the_ranks_own() -> None:
    """A rank past its own deadline ends itself (class Hang) and the gang restarts in place;
    the operator's deadline comes IN_PLACE_HANG_GRACE_SECONDS later, for a gang that cannot."""
    deadline = make_spec().failure_policy.progress_deadline_seconds
    late = NOW - deadline - detect.HANG_EVIDENCE_GRACE_SECONDS - 1
    stale = running_status(last_progress_time=late)
    plain = dc.decide(observe(status=stale, progress=None, scrape=SCRAPED))
    assert plain.failure is not None and plain.failure.cause is st.Cause.HANG
    d = dc.decide(observe(spec=_in_place_spec(), status=stale, progress=None, scrape=SCRAPED))
    assert d.status.phase is st.Phase.RUNNING and d.launch is None
    wake = late + deadline + detect.hang_grace(_in_place_spec()) + 0.05
    assert d.requeue_after == pytest.approx(wake - NOW)
    record = _in_place_record(0, **{"class": contract.FailureClass.HANG.value, "step": 50})
    hung = dc.decide(observe(spec=_in_place_spec(), progress=_in_place_progress(1, record)))
    assert hung.status.last_failure is not None
    assert hung.status.last_failure.cause is st.Cause.HANG


@pytest.mark.parametrize(
    ("gang", "hung", "why"),
    [
        pytest.param(None, False, "", id="not-asked"),
        pytest.param(ob.GangHealth.of({"quiet": {"0": 0.2, "1": 0.4}}), False, "", id="all-there"),
        pytest.param(ob.GangHealth.of({"quiet": {"0": 0.2, "1": 31.0}}), True,
                     "keepers silent: node 1 for 31s", id="a-keeper-frozen"),
        pytest.param(ob.GangHealth(answered=False, error="timed out"), True,
                     "coordinator did not answer (timed out)", id="node-0-frozen"),
        pytest.param(ob.GangHealth.of({"final": True}), True, "stopped restarting", id="final"),
    ],
)  # fmt: skip
def test_a_gang_whose_keepers_cannot_restart_in_place_is_not_waited_for(
    gang: ob.GangHealth | None, hung: bool, why: str
) -> None:
    """Past the deadline and its evidence grace, the operator asks the gang's coordinator (node
    rank 0's keeper) whether every keeper is there; a frozen pod's keeper falls silent (or node
    0's whole coordinator does), and the hang is declared without the in-place grace."""
    spec = _in_place_spec()
    deadline = spec.failure_policy.progress_deadline_seconds
    late = NOW - deadline - detect.HANG_EVIDENCE_GRACE_SECONDS - 1
    stale = running_status(last_progress_time=late)
    obs = observe(spec=spec, status=stale, progress=None, scrape=SCRAPED,
                  pods=pods(r0={"ip": "10.0.0.5"}), gang=gang)  # fmt: skip
    assert detect.asks_the_gang(obs) == "10.0.0.5"
    d = dc.decide(obs)
    assert (d.failure is not None and d.failure.cause is st.Cause.HANG) is hung, d.failure
    if hung:
        assert d.failure is not None and why in d.failure.message, d.failure.message
    # before the deadline's grace, and past the in-place one, nobody asks
    early = dataclasses.replace(obs, status=running_status(last_progress_time=NOW - deadline))
    assert detect.asks_the_gang(early) is None
    over = dataclasses.replace(obs, status=running_status(last_progress_time=NOW - 200))
    assert detect.asks_the_gang(over) is None


# --- the memory tier (checkpoint.memory; fsdp_worker.checkpointing.memtier) ---------------------


def _memory_spec(**memory: Any) -> api.FSDPJobSpec:
    spec = _in_place_spec()
    ckpt = spec.checkpoint.model_copy(update={"memory": config.MemoryTierConfig(**memory)})
    return spec.model_copy(update={"checkpoint": ckpt})


def test_the_memory_tier_needs_restarts_in_place_and_names_the_fields() -> None:
    doc = make_spec().model_dump(by_alias=True, exclude_none=True)
    doc["checkpoint"]["memory"] = {"intervalSteps": 5}
    with pytest.raises(pydantic.ValidationError) as err:
        api.FSDPJobSpec.model_validate(doc)
    assert "checkpoint.memory" in str(err.value) and "inPlaceRestarts=0" in str(err.value)
    doc["failurePolicy"]["inPlaceRestarts"] = 2
    assert api.FSDPJobSpec.model_validate(doc).checkpoint.memory is not None
    doc["checkpoint"]["memory"]["sizeLimit"] = "lots"
    with pytest.raises(pydantic.ValidationError, match="sizeLimit"):
        api.FSDPJobSpec.model_validate(doc)


def test_pods_get_a_memory_volume_and_its_path_only_with_the_memory_tier() -> None:
    from fsdp_operator.render import templates

    job = templates.JobRef(namespace="ns", name="job", uid="u1")
    launch = dc.Launch(attempt=1, replicas=2, resume_path="")
    plain = templates.worker_pod(job, _in_place_spec(), launch, node_rank=0)
    tiered = templates.worker_pod(job, _memory_spec(size_limit="3Gi"), launch, node_rank=0)
    volume = {"name": "fsdp-memory", "emptyDir": {"medium": "Memory", "sizeLimit": "3Gi"}}
    assert volume in tiered["spec"]["volumes"]
    assert all(v["name"] != "fsdp-memory" for v in plain["spec"]["volumes"])
    (c,) = tiered["spec"]["containers"]
    assert {"name": "fsdp-memory", "mountPath": contract.MEMORY_MOUNT} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[contract.ENV_MEMORY_ROOT] == contract.MEMORY_MOUNT
    assert contract.ENV_MEMORY_ROOT not in {
        e["name"] for e in plain["spec"]["containers"][0]["env"]
    }


def test_a_restart_from_memory_is_kept_as_such_and_counts_as_progress() -> None:
    """A rank that failed with memory holding a step newer than the claim's: the no-progress
    breaker counts that step as sealed; the next generation's load is kept as from memory."""
    before = running_status()
    before.sealed_step, before.resumed_from_step = 60, 60
    record = _in_place_record(0, step=75, **{contract.MEMORY_STEP_KEY: 74})
    prog = _in_place_progress(1, record, resumed_from=74, resumed_from_memory=True)
    d = dc.decide(observe(spec=_memory_spec(), status=before, progress=prog))
    s = d.status
    (restart,) = s.history[-1].restarts_in_place
    assert (restart.resumed_from_step, restart.from_memory, restart.steps_lost) == (74, True, 1)
    assert s.restarts.without_progress == 0
    # Without the memory step the claim's 60 is all there is: no progress since 60.
    plain = _in_place_progress(1, _in_place_record(0, step=75))
    d = dc.decide(observe(spec=_memory_spec(), status=before, progress=plain))
    assert d.status.restarts.without_progress == 1
    # An in-place failure is a failure; only a recreated gang is a gang failure.
    assert (s.reliability.failures, s.reliability.gang_failures) == (1, 0)


# --- spares (spec.spares; fsdp_worker.keeper.gang's replace) --------------------------------------


def _spare_spec(spares: int = 1) -> api.FSDPJobSpec:
    return _in_place_spec().model_copy(update={"spares": spares})


def _spare(index: int = 0, node: str = "node-5", **over: Any) -> ob.PodView:
    fields: dict[str, Any] = {"name": f"job-a1-s{index}", "attempt": 1, "rank": -1,
                              "phase": ob.PodPhase.RUNNING, "node": node,
                              "spare": index, "ip": f"10.0.0.{20 + index}"}  # fmt: skip
    fields.update(over)
    return ob.PodView(**fields)


def _spare_status(**over: Any) -> st.FSDPJobStatus:
    return running_status(spares=st.Spares(wanted=1, next_index=1), **over)


def test_spares_need_restarts_in_place_and_are_made_beside_a_running_gang() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"spares=1 but failurePolicy"):
        make_spec(spares=1)
    d = dc.decide(observe(spec=_spare_spec(2), status=running_status(spares=st.Spares(wanted=2)),
                          nodes=nodes(7)))  # fmt: skip
    assert d.spares == [0, 1] and d.status.spares is not None
    assert (d.status.spares.next_index, d.status.spares.pending) == (2, 2)
    # Made a moment ago and not seen yet: not made twice.
    again = dc.decide(observe(spec=_spare_spec(2), status=d.status, nodes=nodes(7)))
    assert again.spares == []
    # One runs, one ended: the ended one goes and a new number replaces it.
    ended = _spare(1, phase=ob.PodPhase.FAILED)
    later = dc.decide(observe(spec=_spare_spec(2), status=d.status, now=NOW + dc.EXPECT_SECONDS,
                              spares=[_spare(0), ended], nodes=nodes(7)))  # fmt: skip
    assert [x.name for x in later.delete] == ["job-a1-s1"] and later.spares == [2]
    assert later.status.spares is not None and later.status.spares.running == 1
    # A slow watch had one made twice: the surplus goes.
    three = [_spare(0), _spare(2), _spare(3)]
    extra = dc.decide(observe(spec=_spare_spec(2), status=later.status, now=NOW + 100,
                              spares=three, nodes=nodes(7)))  # fmt: skip
    assert [x.name for x in extra.delete] == ["job-a1-s3"] and extra.spares == []


def test_a_lost_node_is_taken_over_by_a_spare_without_touching_the_gang() -> None:
    obs = observe(spec=_spare_spec(), status=_spare_status(), nodes=nodes(6, down={2: NOW - 31}),
                  pods=pods(r0={"ip": "10.0.0.5"}), spares=[_spare(0)])  # fmt: skip
    d = dc.decide(obs)
    assert d.takeover == dc.Takeover(
        spare="job-a1-s0", index=0, node_rank=2, lost="job-a1-2", coordinator="10.0.0.5:29501",
        master="10.0.0.5:29500", spare_at="10.0.0.20:29501",
        failure={"class": "NodeLost", "time": NOW - 31, "rank": 2, "pod": "job-a1-2",
                 "message": d.takeover.failure["message"] if d.takeover else "",
                 "nodeName": "node-2", "detected": NOW},
    )  # fmt: skip
    assert d.launch is None and d.delete == [] and d.status.attempt == 1
    assert d.status.phase is st.Phase.RUNNING and d.status.restarts.total == 0
    assert d.status.spares is not None and d.status.spares.takeovers == 1
    assert [e.node for e in d.status.excluded_nodes] == ["node-2"]
    assert [e.reason for e in d.events if e.type is dc.EventType.WARNING] == ["SpareTakeover"]
    # The next pass, the lost pod not gone yet: handled, not a second takeover or a restart.
    again = dc.decide(dataclasses.replace(obs, status=d.status))
    assert again.takeover is None and again.launch is None and again.failure is None
    # The coordinator refused: the gang is recreated as without spares.
    refused = d.status.model_copy(deep=True)
    assert refused.spares is not None
    refused.spares.refused, refused.spares.replaced = "job-a1-2", []
    d = dc.decide(dataclasses.replace(obs, status=refused))
    assert d.takeover is None and d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert {x.name for x in d.delete} == {f"job-a1-{r}" for r in range(4)} | {"job-a1-s0"}


def _addressed(**over: Any) -> list[ob.PodView]:
    return pods(**{f"r{r}": {"ip": f"10.0.0.{5 + r}", **over.get(f"r{r}", {})} for r in range(4)})


def test_node_rank_0s_place_goes_to_a_spare_that_becomes_the_coordinator() -> None:
    """Node rank 0's node is lost: its keeper was the gang's coordinator and its ranks hosted
    the store. The spare is promoted to both, and the three other keepers follow it."""
    spare = _spare(0, ip="10.0.0.9")
    d = dc.decide(observe(spec=_spare_spec(), status=_spare_status(), spares=[spare],
                          nodes=nodes(6, down={0: NOW - 31}), pods=_addressed()))  # fmt: skip
    t = d.takeover
    assert t is not None, d.failure
    assert (t.node_rank, t.lost, t.coordinator, t.master) == (
        0, "job-a1-0", "10.0.0.9:29501", "10.0.0.9:29500")  # fmt: skip
    assert t.followers == ("10.0.0.6:29501", "10.0.0.7:29501", "10.0.0.8:29501")
    assert t.generation == 0 and t.failure["class"] == "NodeLost" and t.failure["rank"] == 0
    assert d.launch is None and d.delete == [] and d.status.restarts.total == 0
    assert [e.node for e in d.status.excluded_nodes] == ["node-0"]


@pytest.mark.parametrize(
    ("spare", "gang"),
    [pytest.param(_spare(0, ip="10.0.0.9", phase=ob.PodPhase.PENDING), {}, id="spare-pending"),
     pytest.param(_spare(0, ip=None), {}, id="spare-without-an-address"),
     pytest.param(_spare(0, ip="10.0.0.9"), {"r2": {"ip": None}}, id="a-follower-unreachable"),
     pytest.param(_spare(0, ip="10.0.0.9"), {"r3": {"phase": ob.PodPhase.PENDING}},
                  id="a-follower-not-running")],
)  # fmt: skip
def test_no_running_spare_or_follower_means_a_recreated_gang(
    spare: ob.PodView, gang: dict[str, Any]
) -> None:
    d = dc.decide(observe(spec=_spare_spec(), status=_spare_status(), spares=[spare],
                          nodes=nodes(6, down={0: NOW - 31}), pods=_addressed(**gang)))  # fmt: skip
    assert d.takeover is None and d.failure is not None and d.launch is not None


def _frozen_obs(quiet: dict[str, float], spare_node: str = "node-5") -> ob.Observed:
    """Past a hang's deadline and its evidence grace, the coordinator answered with `quiet`."""
    spec = _spare_spec()
    late = NOW - spec.failure_policy.progress_deadline_seconds
    late -= detect.HANG_EVIDENCE_GRACE_SECONDS + 1
    return observe(spec=spec, status=_spare_status(last_progress_time=late), progress=None,
                   scrape=SCRAPED, pods=pods(r0={"ip": "10.0.0.5"}), nodes=nodes(6),
                   spares=[_spare(0, node=spare_node)],
                   gang=ob.GangHealth.of({"quiet": quiet}))  # fmt: skip


def test_a_frozen_pods_place_is_taken_by_a_spare_as_a_hang() -> None:
    """Node rank 2's keeper is silent past the deadline (its pod frozen whole): the spare takes
    its rank in a restart in place, recorded as a Hang of that pod (its node is not blamed);
    the operator no longer waits for a restart in place the frozen ranks cannot join."""
    d = dc.decide(_frozen_obs({"0": 0.2, "1": 0.2, "2": 14.0, "3": 0.2}))
    assert d.takeover is not None, d.failure
    t = d.takeover
    assert (t.spare, t.node_rank, t.lost, t.coordinator) == ("job-a1-s0", 2, "job-a1-2",
                                                             "10.0.0.5:29501")  # fmt: skip
    assert t.failure["class"] == contract.FailureClass.HANG.value
    assert (t.failure["pod"], t.failure["nodeName"], t.failure["rank"]) == ("job-a1-2", "node-2", 2)
    assert "no step progress" in t.failure["message"]
    assert "node rank 2's keeper silent for 14s" in t.failure["message"]
    assert "not restarted in place" not in t.failure["message"]
    assert d.launch is None and d.delete == [] and d.status.attempt == 1
    assert d.status.restarts.total == 0 and d.status.excluded_nodes == []
    assert d.status.spares is not None and d.status.spares.replaced == ["job-a1-2"]
    (event,) = [e for e in d.events if e.type is dc.EventType.WARNING]
    assert event.reason == "SpareTakeover" and event.message.startswith("Hang: "), event


@pytest.mark.parametrize(
    "quiet",
    [pytest.param({"0": 0.2, "1": 9.0, "2": 9.0}, id="two-keepers-silent"),
     pytest.param({"0": 0.2, "1": 0.2}, id="none-silent-but-past-the-grace")],
)  # fmt: skip
def test_a_hang_no_single_spare_can_mend_recreates_the_gang(quiet: dict[str, float]) -> None:
    obs = _frozen_obs(quiet)
    if not ob.GangHealth.of({"quiet": quiet}).silent:  # all there: past the in-place grace too
        over = NOW - obs.spec.failure_policy.progress_deadline_seconds - 60
        obs = dataclasses.replace(obs, status=_spare_status(last_progress_time=over))
    d = dc.decide(obs)
    assert d.takeover is None and d.failure is not None and d.failure.cause is st.Cause.HANG
    assert d.launch is not None and d.status.attempt == 2


def test_a_frozen_node_rank_0_is_taken_over_when_its_coordinator_is_silent() -> None:
    """Past the deadline node rank 0's keeper, the coordinator, does not answer at all: its
    pod is frozen whole (or cut off); the spare takes node rank 0's place, as a Hang."""
    obs = dataclasses.replace(
        _frozen_obs({}),
        pods=_addressed(),
        spares=[_spare(0, ip="10.0.0.9")],
        gang=ob.GangHealth(answered=False, error="10.0.0.5:29501: timed out"),
    )
    d = dc.decide(obs)
    t = d.takeover
    assert t is not None and (t.node_rank, t.lost, t.coordinator) == (
        0, "job-a1-0", "10.0.0.9:29501")  # fmt: skip
    assert t.failure["class"] == "Hang" and "did not answer (10.0.0.5:29501: timed out" in (
        t.failure["message"])  # fmt: skip
    assert d.status.excluded_nodes == []


def test_a_spare_on_the_frozen_pods_node_does_not_take_its_place() -> None:
    d = dc.decide(_frozen_obs({"0": 0.2, "2": 14.0}, spare_node="node-2"))
    assert d.takeover is None and d.failure is not None and d.failure.cause is st.Cause.HANG


def test_a_frozen_pods_takeover_arrives_as_a_hang_restart_in_place() -> None:
    """The coordinator's record of that replace: a Hang (application budget) of the frozen pod,
    not of the spare that holds its rank now."""
    frozen = {"class": contract.FailureClass.HANG.value, "pod": "job-a1-2", "nodeName": "node-2",
              "spare": 0, "message": "node rank 2's keeper silent"}  # fmt: skip
    now = pods(r2={"name": "job-a1-s0", "node": "node-5"})
    record = _in_place_record(0, **frozen)
    d = dc.decide(observe(spec=_spare_spec(), status=_spare_status(), pods=now, nodes=nodes(6),
                          progress=_in_place_progress(1, record)))  # fmt: skip
    failure = d.status.last_failure
    assert failure is not None and failure.cause is st.Cause.HANG
    assert (failure.pod, failure.node) == ("job-a1-2", "node-2")
    assert d.status.restarts.application == 1 and d.status.restarts.infrastructure == 0


def test_a_takeover_arrives_as_a_node_lost_restart_in_place() -> None:
    """The coordinator's record of the replace (gang.py): charged as NodeLost (infrastructure),
    kept under the lost pod and node, not the spare that holds the rank now."""
    lost = {"class": contract.FailureClass.NODE_LOST.value, "pod": "job-a1-2",
            "nodeName": "node-2", "spare": 0}  # fmt: skip
    record = _in_place_record(0, **lost)
    now = pods(r2={"name": "job-a1-s0", "node": "node-5"})
    d = dc.decide(observe(spec=_spare_spec(), status=_spare_status(), pods=now, nodes=nodes(6),
                          progress=_in_place_progress(1, record)))  # fmt: skip
    failure = d.status.last_failure
    assert failure is not None and failure.cause is st.Cause.NODE_LOST
    assert (failure.pod, failure.node) == ("job-a1-2", "node-2")
    assert d.status.restarts.infrastructure == 1 and d.status.restarts.application == 0


def test_a_spare_pod_waits_without_a_node_rank() -> None:
    from fsdp_operator.render import templates

    job = templates.JobRef(namespace="ns", name="job", uid="u1")
    pod = templates.spare_pod(job, _spare_spec(), dc.Launch(attempt=3, replicas=4,
                              resume_path=""), index=2)  # fmt: skip
    assert pod["metadata"]["name"] == pod["spec"]["hostname"] == "job-a3-s2"
    labels = pod["metadata"]["labels"]
    assert "fsdpoperator.io/node-rank" not in labels and labels["fsdpoperator.io/spare"] == "2"
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    gang = json.loads(env[contract.ENV_GANG])
    assert (gang["node"], gang["spare"], gang["nodes"]) == (-1, 2, 4)
    # rank 0's probe: a spare may become node rank 0, and until then it is not Ready (nothing
    # of it trains), which nothing reads
    assert c["readinessProbe"] == templates.progress_probe(_spare_spec())


def test_after_a_gang_that_never_met_the_next_attempt_gets_twice_the_time_to_meet() -> None:
    """Two attempts in a row ended RendezvousTimeout: the third may take 4x the deadline to its
    first step (a start slower than the deadline otherwise ends every attempt the same way);
    once it has stepped, the deadline is the deadline again."""
    never = st.Failure(cause=st.Cause.RENDEZVOUS, message="never met", time=NOW - 500)
    missed = [st.HistoryEntry(attempt=a, failure=never, world_size=4) for a in (1, 2)]
    now = st.HistoryEntry(attempt=3, started=NOW - 400, world_size=4)
    status = running_status(attempt=3, last_progress_time=None, history=[*missed, now])
    status.history[-1].timeline = st.Timeline(running=NOW - 350)
    assert (
        dc.decide(observe(status=status, progress=None, scrape=REFUSED, pods=pods(3))).failure
        is None
    )
    status.history[-1].timeline = st.Timeline(running=NOW - 403)  # 4 x 100 s + 2 s grace, past
    d = dc.decide(observe(status=status, progress=None, scrape=REFUSED, pods=pods(3)))
    assert d.failure is not None and d.failure.cause is st.Cause.RENDEZVOUS
    stepped = status.model_copy(update={"last_progress_time": NOW - 103})
    d = dc.decide(observe(status=stepped, progress=None, scrape=SCRAPED, pods=pods(3)))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG


def test_a_finished_jobs_spares_go() -> None:
    done = [dataclasses.replace(p, phase=ob.PodPhase.SUCCEEDED, exit_code=0) for p in pods()]
    d = dc.decide(observe(spec=_spare_spec(), status=_spare_status(), pods=done,
                          spares=[_spare(0)], nodes=nodes(6)))  # fmt: skip
    assert d.status.phase is st.Phase.SUCCEEDED and [x.name for x in d.delete] == ["job-a1-s0"]
    again = dc.decide(observe(spec=_spare_spec(), status=d.status, pods=done,
                              spares=[_spare(0)], nodes=nodes(6)))  # fmt: skip
    assert [x.name for x in again.delete] == ["job-a1-s0"]
