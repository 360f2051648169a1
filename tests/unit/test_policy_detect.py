"""Failure detection through decide() (policy/detect.py): every cause, a lost node, a hang and its
deadlines, a gang that never met, a blind operator, pods stuck Pending, and when to look again.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from fsdp_operator.policy import conditions, deadlines, decide
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import (
    BLIND,
    CONFIG_MSG,
    CRASH_MSG,
    NOW,
    SCRAPED,
    ckpt,
    condition,
    make_spec,
    nodes,
    observe,
    oom_killed_in,
    pods,
    running_status,
)


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
    d = decide.decide(observe(pods=pods(r3={**rank_over, "finished": NOW - 1})))
    assert d.failure is not None and d.failure.cause is cause
    assert d.failure.pod == "job-a1-3" and d.failure.rank == 3 and d.failure.node == "node-3"
    assert d.status.last_failure == d.failure


def test_worker_message_reaches_status() -> None:
    over = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "message": CRASH_MSG, "finished": NOW}
    d = decide.decide(observe(pods=pods(r3=over)))
    assert d.status.last_failure is not None and d.status.last_failure.message == "boom"


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
    d = decide.decide(observe(pods=pods(r3=oom_killed_in(phase, step))))
    f = d.failure
    assert f is not None and f.cause is st.Cause.OOM and f.phase == phase and f.step == step
    when = f"after step {step}" if step is not None else "before its first step"
    assert f.message == f"OOMKilled in {phase} {when} (last recorded: peak 15.0 of 16.0 GiB)"
    assert f.diagnosis.startswith(f"out of memory in {phase}: likely {likely}"), f.diagnosis
    assert d.status.phase is st.Phase.RESTARTING, "a first OOM is retried"


def test_earliest_failed_pod_is_the_root_cause() -> None:
    late = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1}
    first = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 137,
        "reason": "OOMKilled",
        "finished": NOW - 5,
    }
    d = decide.decide(observe(pods=pods(r0=late, r2=first)))
    assert d.failure is not None and d.failure.cause is st.Cause.OOM and d.failure.rank == 2


def test_node_not_ready_within_grace_is_tolerated() -> None:
    d = decide.decide(observe(nodes=nodes(down={2: NOW - 10})))
    assert d.failure is None


def test_node_not_ready_past_grace_is_node_loss_with_force_delete() -> None:
    d = decide.decide(observe(nodes=nodes(down={2: NOW - 31})))
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
    d = decide.decide(observe(nodes=views, status=stopped, progress=ob.Progress(step=50)))
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
    d = decide.decide(observe(nodes=views, progress=ob.Progress(step=51)))
    assert d.failure is None and not d.delete and d.status.step == 51
    assert d.status.last_progress_time == NOW
    # Its steps stop (a real loss: the collectives wait for the lost ranks): lost once they
    # are late by three steps' worth (at least LIVE_WINDOW_SECONDS).
    stepped = running_status(last_progress_time=NOW - 2.0, step=51)
    assert decide.decide(observe(nodes=views, status=stepped, progress=None)).failure is None
    late = running_status(last_progress_time=NOW - deadlines.LIVE_WINDOW_SECONDS - 0.1, step=51)
    d = decide.decide(observe(nodes=views, status=late, progress=None))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    down = nodes(down={2: NOW - 31})
    down[2] = dataclasses.replace(down[2], lease_silent_seconds=40.0, lease_quiet=True)
    d = decide.decide(observe(nodes=down, progress=ob.Progress(step=52)))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert "not Ready for 31s" in d.failure.message


def test_a_silent_lease_before_the_first_step_is_judged_by_the_nodes_keeper() -> None:
    """No step seen yet (the gang imports, meets or loads), so the ranks cannot vouch for the
    node. Where keepers run (inPlaceRestarts) the pass asks the gang's coordinator: a node
    whose keeper still asks it lives (its kubelet only restarting) until nodeLossGraceSeconds;
    its keeper silent too, or the coordinator unreachable, is a loss at once, as is a Lease
    silent without keepers to ask."""
    views = nodes()
    views[2] = dataclasses.replace(views[2], lease_silent_seconds=12.0, lease_quiet=True)
    # rank 0 serves step 0 while the gang meets and loads: no step made
    starting = running_status(last_progress_time=NOW - 1, step=0)
    spec = make_spec(failurePolicy={"inPlaceRestarts": 2, "nodeLossGraceSeconds": 30})
    with_ip = pods(r0={"ip": "10.244.0.5"})

    def decided(spec: Any, gang: ob.GangHealth | None) -> Any:
        obs = observe(
            spec=spec,
            nodes=views,
            status=starting,
            progress=None,
            pods=with_ip,
            gang=gang,
            checkpoint=None,
        )
        return decide.decide(obs)

    def judged(spec: Any, gang: ob.GangHealth | None) -> st.Failure | None:
        failure: st.Failure | None = decided(spec, gang).failure
        return failure

    # The pass asks node rank 0's coordinator, and again every second while it waits
    asking = observe(spec=spec, nodes=views, status=starting, progress=None, pods=with_ip)
    assert deadlines.asks_the_gang(asking) == "10.244.0.5"
    wake = deadlines.next_deadline(asking)
    assert wake is not None and wake <= NOW + deadlines.KEEPER_RECHECK_SECONDS
    alive = ob.GangHealth(answered=True, silent={})
    d = decided(spec, alive)
    assert d.failure is None
    assert d.status.suspect_nodes == ["node-2"] and "keeper still asks" in str(d.events)
    silent_keeper = ob.GangHealth(answered=True, silent={2: 9.0})
    f = judged(spec, silent_keeper)
    assert f is not None and f.cause is st.Cause.NODE_LOST and f.time == NOW - 12.0
    assert "its keeper is silent too (9s)" in f.message
    # the coordinator (node rank 0's pod, on a healthy node) did not answer one ask: rank 0's
    # node may be busy importing; it says nothing of node-2, asked again in a second
    assert judged(spec, ob.GangHealth(answered=False, error="timed out")) is None
    # another node's keeper silent says nothing of node-2's
    assert judged(spec, ob.GangHealth(answered=True, silent={1: 9.0})) is None
    # at the defaults' 22.5 s and long past the grace, a keeper that still asks keeps it alive;
    # NotReady past the grace is a loss whatever it says
    views[2] = dataclasses.replace(views[2], lease_silent_seconds=300.0)
    assert judged(spec, alive) is None
    views[2] = dataclasses.replace(views[2], ready=False, not_ready_since=NOW - 31)
    f = judged(spec, alive)
    assert f is not None and "not Ready for 31s" in f.message
    views[2] = dataclasses.replace(views[2], ready=True, not_ready_since=None)
    # the coordinator itself on the silent node: its silence is that node's
    views[0] = dataclasses.replace(views[0], lease_silent_seconds=12.0, lease_quiet=True)
    f = judged(spec, ob.GangHealth(answered=False, error="timed out"))
    assert f is not None and "coordinator did not answer (timed out)" in f.message
    views[0] = dataclasses.replace(views[0], lease_silent_seconds=None, lease_quiet=False)
    # without keepers nothing speaks for the node before a step: the Lease alone, as before
    views[2] = dataclasses.replace(views[2], lease_silent_seconds=12.0)
    plain = make_spec(failurePolicy={"inPlaceRestarts": 0, "nodeLossGraceSeconds": 30})
    f = judged(plain, None)
    assert f is not None and "the job has made no step yet" in f.message


def test_after_a_restart_in_place_only_the_new_generations_steps_count() -> None:
    """A restart in place imports, meets and loads again: until that generation steps past
    the step it resumed from, the attempt's earlier steps do not vouch for a node."""
    crash = st.Failure(cause=st.Cause.CRASH, time=NOW - 20)
    restart = st.InPlaceRestart(generation=0, failure=crash, detected=NOW - 20)
    entry = st.HistoryEntry(attempt=1, started=NOW - 200, world_size=4)
    entry.restarts_in_place = [restart]
    s = running_status(history=[entry], step=40, last_progress_time=NOW - 19)
    assert not deadlines.has_stepped(s)  # rank 0 serves the step it is loading
    restart.resumed_from_step = 40
    assert not deadlines.has_stepped(s)
    s.step, s.last_progress_time = 41, NOW - 1
    assert deadlines.has_stepped(s)
    s.step = 40
    restart.resumed = NOW - 2  # the ranks' own word: the generation's first step
    assert deadlines.has_stepped(s)


def test_a_blind_job_is_not_hung_by_the_node_controllers_not_ready_mark() -> None:
    """After a long API-server stall the node lifecycle controller turns every pod not Ready
    with no reason; for a job whose scrapes get no answer, that is no probe's verdict."""
    status = running_status(last_progress_time=NOW - 103)
    marked = {"ready": False, "ready_changed": NOW - 2, "ready_reason": ""}
    d = decide.decide(observe(status=status, progress=None, scrape=BLIND, pods=pods(r0=marked)))
    assert d.failure is None, d.failure


def test_rank_0_is_scraped_every_second_while_a_node_of_the_gang_is_quiet() -> None:
    from fsdp_operator.io import probe
    from fsdp_operator.run import reconcile

    views = nodes()
    obs = observe(nodes=views, pods=pods(r0={"ip": "10.244.0.5"}))
    d = decide.decide(obs)
    calm = reconcile._probe_target(obs, d, max_interval=60.0, job_uid=None)
    assert calm is not None and calm.every > probe.SUSPECT_INTERVAL
    views[2] = dataclasses.replace(views[2], lease_quiet=True)
    obs = observe(nodes=views, pods=pods(r0={"ip": "10.244.0.5"}))
    suspect = reconcile._probe_target(obs, decide.decide(obs), max_interval=60.0, job_uid=None)
    assert suspect is not None and suspect.every == probe.SUSPECT_INTERVAL


def test_node_loss_beats_the_crashes_it_causes() -> None:
    crashed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 1}
    d = decide.decide(observe(pods=pods(r0=crashed), nodes=nodes(down={2: NOW - 60})))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST


def test_vanished_pod_is_eviction() -> None:
    d = decide.decide(observe(pods=pods()[:3]))
    assert d.failure is not None and d.failure.cause is st.Cause.EVICTED and d.failure.rank == 3


def test_hang_after_progress_deadline() -> None:
    status = running_status(last_progress_time=NOW - 101)
    assert decide.decide(observe(status=status, progress=None, scrape=SCRAPED)).failure is None
    status = running_status(last_progress_time=NOW - 103)
    d = decide.decide(observe(status=status, progress=None, scrape=SCRAPED))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG and d.failure.rank == 0
    # useful work stopped at the last progress: detection took the deadline (and then some)
    assert d.failure.time == NOW - 103 and d.status.history[0].detect_seconds == 103
    # the pods' logs and evidence are read before they are deleted
    assert d.collect is not None and d.collect.hang and d.collect.attempt == 1
    assert [name for _, name, _ in d.collect.pods] == [p.name for p in pods()]
    assert d.status.history[0].failure is not None
    assert d.status.history[0].failure.cause is st.Cause.HANG


@pytest.mark.parametrize(
    ("step", "quiet", "hung"),
    [
        pytest.param(99, 23, True, id="mid-run-past-the-deadline"),
        pytest.param(100, 23, False, id="at-the-last-step-the-save-and-exit-get-the-exit-grace"),
        pytest.param(100, 89, False, id="still-within-the-exit-grace"),
        pytest.param(100, 91, True, id="past-the-exit-grace-a-hang"),
    ],
)
def test_after_the_last_step_no_step_comes_so_the_exit_grace_applies(
    step: int, quiet: float, hung: bool
) -> None:
    """Seen on a loaded node: rank 0 at the final step, the last save and the keepers' exit
    barrier took 29 s; at a 20 s deadline the finished gang was judged hung and recreated."""
    policy = {**make_spec().failure_policy.model_dump(by_alias=True), "progressDeadlineSeconds": 20}
    training = {"globalBatchSize": 8, "microBatchSize": 1, "steps": 100}
    spec = make_spec(failurePolicy=policy, training=training)
    status = running_status(step=step, last_progress_time=NOW - quiet)
    d = decide.decide(observe(spec=spec, status=status, progress=None, scrape=SCRAPED))
    assert (d.failure is not None and d.failure.cause is st.Cause.HANG) == hung, d.failure


@pytest.mark.parametrize(
    ("ready", "reason", "hung"),
    [
        pytest.param(None, "", False, id="no-probe-result-yet"),
        pytest.param(True, "", False, id="probe-says-progress"),
        pytest.param(False, "ContainersNotReady", True, id="probe-says-none-is-evidence"),
        # the node lifecycle controller's mark after a long API-server stall (its grace passed
        # with no renewal seen from any node): every pod not Ready, no reason, no probe said it
        pytest.param(False, "", False, id="node-controllers-mark-is-no-probe"),
    ],
)
def test_an_operator_that_has_not_scraped_yet_judges_no_hang_on_old_status(
    ready: bool | None, reason: str, hung: bool
) -> None:
    """A replica that has just taken the lead (after a failover, or an API-server stall longer
    than its renew deadline) has no scrape of rank 0 yet, and the status's last step is as old
    as the stall: old news, not evidence. Its first scrape is due at once; only rank 0's
    readiness probe failing is evidence meanwhile."""
    status = running_status(last_progress_time=NOW - 300)
    rank0 = {"ready": ready, "ready_reason": reason}
    d = decide.decide(observe(status=status, progress=None, scrape=None, pods=pods(r0=rank0)))
    assert (d.failure is not None and d.failure.cause is st.Cause.HANG) is hung, d.failure


def test_the_startup_deadline_allows_the_first_step_and_then_the_deadline_holds() -> None:
    """startupDeadlineSeconds 300 beside a progress deadline of 100: an attempt with no step
    yet is not hung at 250 s of running, it is at 303 s; once it has stepped, 100 s with no
    step is a hang again."""
    spec = make_spec(failurePolicy={"progressDeadlineSeconds": 100, "startupDeadlineSeconds": 300})
    status = running_status(last_progress_time=None)
    status.history[-1].timeline = st.Timeline(running=NOW - 250)
    assert (
        decide.decide(observe(spec=spec, status=status, progress=None, scrape=SCRAPED)).failure
        is None
    )
    status.history[-1].timeline = st.Timeline(running=NOW - 303)
    d = decide.decide(observe(spec=spec, status=status, progress=None, scrape=SCRAPED))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG, d.failure
    stepped = running_status(last_progress_time=NOW - 103)
    d = decide.decide(observe(spec=spec, status=stepped, progress=None, scrape=SCRAPED))
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
        rank0 = {
            "ready": False,
            "ready_changed": NOW - changed,
            "ready_reason": "ContainersNotReady",
        }
        obs = observe(spec=spec, status=status, progress=None, scrape=BLIND, pods=pods(r0=rank0))
        return decide.decide(obs).failure

    assert judged(running=50, changed=10) is None  # within the progress deadline of running
    hung = judged(running=150, changed=10)
    assert hung is not None and hung.cause is st.Cause.HANG, hung
    assert "within 100s (300s to a first)" in hung.message, hung.message
    assert judged(running=150, changed=160) is None  # never Ready: still starting
    late = judged(running=303, changed=310)
    assert late is not None and late.cause is st.Cause.HANG, late


def test_no_hang_while_steps_advance() -> None:
    status = running_status(last_progress_time=NOW - 101)
    d = decide.decide(observe(status=status, progress=ob.Progress(step=51)))
    assert d.failure is None and d.status.last_progress_time == NOW


REFUSED = ob.ScrapeHealth(
    "job-a1-0",
    failures=0,
    error="GET http://10.0.0.5:9400/metrics: Connect call failed",
    address="10.0.0.5:9400",
    answered=False,
)


@pytest.mark.parametrize(
    ("scrape", "cause"),
    [
        pytest.param(REFUSED, st.Cause.RENDEZVOUS, id="never-served-the-gang-never-met"),
        pytest.param(dataclasses.replace(REFUSED, answered=True), st.Cause.HANG, id="served"),
        pytest.param(
            dataclasses.replace(REFUSED, failures=1, error="GET …/metrics: no answer within 1s"),
            st.Cause.HANG,
            id="the-last-scrape-timed-out-no-refusal",
        ),
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
    d = decide.decide(observe(status=status, progress=None, scrape=scrape))
    assert d.failure is not None and d.failure.cause is cause, d.failure
    restarts = d.status.restarts
    if cause is st.Cause.RENDEZVOUS:
        assert "the gang never met" in d.failure.message and "10.0.0.5:9400" in d.failure.message
        assert (restarts.infrastructure, restarts.application) == (1, 0)
        assert restarts.without_progress == 0
        assert condition(d, conditions.PROGRESS_OBSERVED) is None, "refused is no scrape failure"
    else:
        assert (restarts.infrastructure, restarts.application) == (0, 1)


def test_a_checkpoint_sealed_in_the_attempt_is_progress_though_no_scrape_answered() -> None:
    """Seen in CI on a loaded machine: rank 0's metrics missed every scrape for 32 s (refused
    before its server was up, then too slow) while the gang sealed step 25; the attempt was
    ended as a gang that never met. A checkpoint of this attempt past the step proves the gang
    met and trains: it is progress, and the hang's clock starts from it."""
    status = running_status(last_progress_time=None, step=None)
    status.history[-1].timeline = st.Timeline(running=NOW - 103)
    obs = observe(status=status, progress=None, scrape=REFUSED, checkpoint=ckpt(25))
    d = decide.decide(obs)
    assert d.failure is None, d.failure
    assert (d.status.step, d.status.last_progress_time) == (25, NOW)
    # one the attempt before wrote (the resume point) is no such proof
    status = running_status(last_progress_time=None, step=None, attempt=2)
    status.history = [st.HistoryEntry(attempt=2, started=NOW - 200, world_size=4)]
    status.history[-1].timeline = st.Timeline(running=NOW - 103)
    obs = observe(status=status, progress=None, scrape=REFUSED, checkpoint=ckpt(25, attempt=1))
    obs = dataclasses.replace(obs, pods=pods(attempt=2))
    d = decide.decide(obs)
    assert d.failure is not None and d.failure.cause is st.Cause.RENDEZVOUS, d.failure


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
    reason = "ContainersNotReady" if ready is False else ""
    rank0 = {"ready": ready, "ready_changed": ready_changed, "ready_reason": reason}
    d = decide.decide(observe(status=status, progress=None, scrape=BLIND, pods=pods(r0=rank0)))
    cond = condition(d, conditions.PROGRESS_OBSERVED)
    assert cond is not None and cond.status == "False" and cond.reason == "ScrapeFailing"
    assert "10.0.0.5:9400" in cond.message and "no answer within 1s" in cond.message
    if hang_at is None:
        assert d.failure is None and d.status.phase is st.Phase.RUNNING
        assert "ProgressUnobserved" in [e.reason for e in d.events]
        return
    assert d.failure is not None and d.failure.cause is st.Cause.HANG
    assert d.failure.time == hang_at
    assert "readiness probe" in d.failure.message and "no answer within 1s" in d.failure.message


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
    d = decide.decide(observe(status=status, pods=pods(r3=stuck)))
    assert d.failure is not None and d.failure.cause is cause and d.status.phase is phase


def test_pending_within_timeout_waits() -> None:
    status = running_status(phase=st.Phase.PENDING, attempt_started=NOW - 10)
    stuck = {"phase": ob.PodPhase.PENDING, "unschedulable": True, "node": None}
    d = decide.decide(observe(status=status, pods=pods(r3=stuck)))
    assert d.failure is None and d.launch is None


def test_wakes_when_a_node_grace_period_ends_not_at_the_next_poll() -> None:
    d = decide.decide(observe(nodes=nodes(down={2: NOW - 28})))
    assert d.failure is None and d.requeue_after == pytest.approx(2.05)


def test_a_cuda_out_of_memory_error_comes_with_the_allocators_view() -> None:
    gib = 1 << 30
    doc = {
        "class": "OutOfMemory",
        "rank": 3,
        "step": 40,
        "exitCode": 1,
        "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
        "phase": "optimizer step",
        "memory": {"cudaAllocatedBytes": 15 * gib, "cudaTotalBytes": 16 * gib},
        "ledger": {"persistentBytesPerRank": 12 * gib, "largestGatheredBytes": gib},
    }
    failed = {
        "phase": ob.PodPhase.FAILED,
        "exit_code": 1,
        "finished": NOW - 1,
        "message": json.dumps(doc),
    }
    f = decide.decide(observe(pods=pods(r3=failed))).failure
    assert f is not None and f.cause is st.Cause.OOM and f.phase == "optimizer step"
    assert f.message == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert f.diagnosis == (
        "out of memory in optimizer step: likely optimizer state: more replicas shard it "
        "thinner, or a lighter optimizer (allocated 15.0 of 16.0 GiB: persistent shards 12.0, "
        "largest gathered block 1.0, the rest (activations, temporaries) 2.0 GiB)"
    )


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
        decide.decide(observe(status=status, progress=None, scrape=REFUSED, pods=pods(3))).failure
        is None
    )
    status.history[-1].timeline = st.Timeline(running=NOW - 403)  # 4 x 100 s + 2 s grace, past
    d = decide.decide(observe(status=status, progress=None, scrape=REFUSED, pods=pods(3)))
    assert d.failure is not None and d.failure.cause is st.Cause.RENDEZVOUS
    stepped = status.model_copy(update={"last_progress_time": NOW - 103})
    d = decide.decide(observe(status=stepped, progress=None, scrape=SCRAPED, pods=pods(3)))
    assert d.failure is not None and d.failure.cause is st.Cause.HANG
