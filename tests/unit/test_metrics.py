"""The operator's own series: what a platform's Prometheus can ask, and what it keeps."""

from __future__ import annotations

import prometheus_client as prom

from fsdp_operator.io import metrics


def _value(name: str, **labels: str) -> float | None:
    return prom.REGISTRY.get_sample_value(name, labels)


def test_per_job_series_do_not_collide_with_prometheus_target_labels() -> None:
    for series in (
        metrics.GOODPUT,
        metrics.PRODUCTIVE,
        metrics.WALL,
        metrics.LOST,
        metrics.CKPT_AGE,
        metrics.CKPT_TIME,
        metrics.CHECKPOINT_INTERVAL,
        metrics.JOB_FAILURES,
        metrics.JOB_PHASE,
        metrics.SLOW_RANK_SLOWDOWN,
        metrics.QUEUE_WAIT,
    ):
        names = set(series._labelnames)
        assert {"job_namespace", "job_name"} <= names and not names & {"namespace", "job"}


def test_which_job_is_in_a_restart_storm_can_be_asked_and_is_forgotten_with_it() -> None:
    for _ in range(3):
        metrics.count_failure("team-a", "storm", "Crash")
    metrics.count_failure("team-a", "calm", "OOMKilled")
    metrics.CKPT_TIME.labels("team-a", "storm").set(1_700_000_000.0)
    storm = {"job_namespace": "team-a", "job_name": "storm", "cause": "Crash"}
    assert _value("fsdpjob_job_failures_total", **storm) == 3
    metrics.forget("team-a", "storm")
    assert _value("fsdpjob_job_failures_total", **storm) is None
    assert (
        _value("fsdpjob_checkpoint_timestamp_seconds", job_namespace="team-a", job_name="storm")
        is None
    )
    calm = {"job_namespace": "team-a", "job_name": "calm", "cause": "OOMKilled"}
    assert _value("fsdpjob_job_failures_total", **calm) == 1
    metrics.forget("team-a", "calm")


def test_each_job_has_one_phase_series_that_follows_it_and_goes_with_it() -> None:
    job = {"job_namespace": "team-b", "job_name": "llm"}
    metrics.count_phase("team-b", "llm", "Running")
    assert _value("fsdpjob_job_phase", **job, phase="Running") == 1
    metrics.count_phase("team-b", "llm", "Restarting")
    assert _value("fsdpjob_job_phase", **job, phase="Running") is None
    assert _value("fsdpjob_job_phase", **job, phase="Restarting") == 1
    metrics.forget("team-b", "llm")
    assert _value("fsdpjob_job_phase", **job, phase="Restarting") is None


def test_goodput_totals_for_a_windowed_ratio_go_with_the_job() -> None:
    """The low-goodput alert takes delta() of both totals: they must exist per job and leave
    with it (a deleted job's last value would otherwise stay until the operator restarts)."""
    job = {"job_namespace": "team-c", "job_name": "llm"}
    metrics.PRODUCTIVE.labels("team-c", "llm").set(900.0)
    metrics.WALL.labels("team-c", "llm").set(1000.0)
    assert _value("fsdpjob_goodput_productive_seconds", **job) == 900.0
    assert _value("fsdpjob_goodput_wall_seconds", **job) == 1000.0
    metrics.forget("team-c", "llm")
    assert _value("fsdpjob_goodput_productive_seconds", **job) is None
    assert _value("fsdpjob_goodput_wall_seconds", **job) is None


def test_a_slow_ranks_slowdown_is_a_series_while_it_is_named() -> None:
    job = {"job_namespace": "team-c", "job_name": "slow"}
    metrics.set_slow_rank("team-c", "slow", 2.04)
    assert _value("fsdpjob_slow_rank_slowdown", **job) == 2.04
    metrics.set_slow_rank("team-c", "slow", None)  # cleared: no series, no alert
    assert _value("fsdpjob_slow_rank_slowdown", **job) is None
    metrics.set_slow_rank("team-c", "slow", 1.5)
    metrics.forget("team-c", "slow")
    assert _value("fsdpjob_slow_rank_slowdown", **job) is None


def test_the_operators_time_histograms_reach_hours() -> None:
    """A restart that waits for quota or for a node takes hours; the buckets say how many
    (every operator histogram shares them; the unlabelled ones show before any observation)."""
    page = prom.generate_latest(prom.REGISTRY).decode()
    for name in ("fsdpjob_recovery_seconds", "fsdpjob_evidence_seconds"):
        for bound in ("600.0", "3600.0", "14400.0"):
            assert f'{name}_bucket{{le="{bound}"}}' in page, (name, bound)


def test_queue_wait_is_the_attempts_wait_for_admission() -> None:
    """fsdpjob_queue_wait_seconds (the dashboard's Queue wait panel): measured once admitted,
    so far while Queued, 0 without a queue."""
    from fsdp_operator.run import recording
    from fsdp_operator.types import status as st
    from tests.builders import NOW, running_status

    queue = st.QueueStatus(name="lq", pod_group="pg")
    assert recording.queue_wait(running_status(), NOW) == 0.0
    waiting = running_status(phase=st.Phase.QUEUED, attempt_started=NOW - 30, queue=queue)
    assert recording.queue_wait(waiting, NOW) == 30.0
    admitted = queue.model_copy(update={"queued_seconds": 42.5, "admitted": NOW - 5})
    assert recording.queue_wait(running_status(queue=admitted), NOW) == 42.5
