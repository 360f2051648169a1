"""`intervalSteps: auto`: the Young/Daly rule as a truth table, the model it optimises, the
failure-rate estimate, and the worker's report as the operator parses it."""

from __future__ import annotations

import math

import pytest

from fsdp_operator.io import kube, observe
from fsdp_operator.types import api, scrape
from fsdp_operator.types import status as st
from fsdp_worker import contract
from fsdp_worker.contract import config_checkpoint, interval
from fsdp_worker.telemetry import metrics

HOUR = 3600.0


@pytest.mark.parametrize(
    ("save", "mtbf", "step", "floor", "ceiling", "steps"),
    [
        # sqrt(2 * 10 * 21600) = 657.27 s, x = sqrt(10 / 43200) = 0.0152:
        # 657.27 * (1 + x/3 + x^2/9) - 10 = 650.6 s
        (10.0, 6 * HOUR, 1.0, 10, 100_000, 651),
        (10.0, 6 * HOUR, 4.0, 10, 100_000, 163),  # slower steps: fewer of them
        (40.0, 6 * HOUR, 1.0, 10, 100_000, 1288),  # 4x the save cost: about 2x the interval
        (10.0, 24 * HOUR, 1.0, 10, 100_000, 1308),  # 4x the MTBF: about 2x the interval
        (10.0, 6 * HOUR, 1.0, 10, 500, 500),  # the ceiling
        (0.01, 60.0, 1.0, 10, 100_000, 10),  # the floor
        (0.0, 6 * HOUR, 1.0, 3, 100_000, 3),  # a free save: as often as the floor allows
        (100.0, 40.0, 1.0, 1, 100_000, 40),  # save cost >= 2 MTBF: Daly says one MTBF
    ],
)
def test_auto_interval_truth_table(
    save: float, mtbf: float, step: float, floor: int, ceiling: int, steps: int
) -> None:
    got = interval.choose(
        save_seconds=save,
        step_seconds=step,
        mtbf_seconds=mtbf,
        floor=floor,
        ceiling=ceiling,
        failures=0,
    )
    assert got.steps == steps and got.auto
    assert (got.save_seconds, got.step_seconds, got.mtbf_seconds) == (save, step, mtbf)


@pytest.mark.parametrize(("save", "step"), [(None, 1.0), (10.0, None), (None, None)])
def test_until_both_costs_are_measured_auto_checkpoints_at_the_floor(
    save: float | None, step: float | None
) -> None:
    got = interval.choose(
        save_seconds=save, step_seconds=step, mtbf_seconds=HOUR, floor=25, ceiling=1000
    )
    assert got.steps == 25


def test_bad_bounds_are_refused_with_both_values() -> None:
    with pytest.raises(ValueError, match="floor=50 ceiling=10"):
        interval.choose(save_seconds=1, step_seconds=1, mtbf_seconds=HOUR, floor=50, ceiling=10)
    with pytest.raises(ValueError, match=r"maxSteps \(10\) must be >= minSteps \(50\)"):
        config_checkpoint.AutoIntervalConfig.model_validate({"minSteps": 50, "maxSteps": 10})


@pytest.mark.parametrize(("save", "mtbf"), [(1.0, HOUR), (10.0, 6 * HOUR), (60.0, 2 * HOUR)])
@pytest.mark.parametrize("exposed", [True, False], ids=["daly", "uptime-faults"])
def test_daly_interval_maximises_the_model_goodput(save: float, mtbf: float, exposed: bool) -> None:
    """The rule's interval is the optimum of the model the benchmark plots (within 0.5 %),
    whether failures can strike during a restart (Daly) or only while training (the bench)."""
    best = interval.daly_interval_seconds(save, mtbf)

    def g(tau: float) -> float:
        return interval.model_goodput(
            interval_seconds=tau,
            save_seconds=save,
            restart_seconds=60.0,
            mtbf_seconds=mtbf,
            fail_while_restarting=exposed,
        )

    grid = [best * math.exp(k / 200) for k in range(-400, 401)]
    argmax = max(grid, key=g)
    assert argmax == pytest.approx(best, rel=0.005)
    assert g(best) > g(best / 4) and g(best) > g(best * 4)
    assert interval.young_interval_seconds(save, mtbf) == pytest.approx(best, rel=0.1)


def test_model_goodput_is_one_without_costs_and_falls_with_failures() -> None:
    free = interval.model_goodput(
        interval_seconds=100, save_seconds=0, restart_seconds=0, mtbf_seconds=1e12
    )
    assert free == pytest.approx(1.0)
    often = interval.model_goodput(
        interval_seconds=100, save_seconds=5, restart_seconds=30, mtbf_seconds=600
    )
    rare = interval.model_goodput(
        interval_seconds=100, save_seconds=5, restart_seconds=30, mtbf_seconds=60000
    )
    assert 0 < often < rare < 1


@pytest.mark.parametrize(
    ("failures", "uptime", "prior", "mtbf"),
    [
        (0, 0.0, 6 * HOUR, 6 * HOUR),  # nothing seen: the prior
        (0, 18 * HOUR, 6 * HOUR, 24 * HOUR),  # a day without failures: longer
        (3, 18 * HOUR, 6 * HOUR, 6 * HOUR),  # 3 failures in 18 h: the job's own rate wins
        (99, 100 * HOUR, 0.5 * HOUR, 100.5 * HOUR / 100),
    ],
)
def test_mtbf_joins_the_jobs_own_record_and_the_prior(
    failures: int, uptime: float, prior: float, mtbf: float
) -> None:
    got = interval.mtbf_estimate(failures=failures, uptime_seconds=uptime, prior_seconds=prior)
    assert got == pytest.approx(mtbf)


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (
            '{"failures":3,"uptimeSeconds":3798.0,"saveSeconds":3.0,"stepSeconds":0.5}',
            interval.Reliability(3, 3798.0, 3.0, 0.5),
        ),
        (
            '{"failures":1,"uptimeSeconds":10,"saveSeconds":null,"stepSeconds":null}',
            interval.Reliability(1, 10.0),
        ),
        ("", interval.Reliability()),
        ("not json", interval.Reliability()),
        (
            '{"failures":-4,"uptimeSeconds":"x","saveSeconds":true,"stepSeconds":1e999}',
            interval.Reliability(),
        ),
    ],
)
def test_the_reliability_env_is_read_leniently(raw: str, parsed: interval.Reliability) -> None:
    assert interval.Reliability.parse(raw) == parsed


def test_the_reliability_env_round_trips() -> None:
    r = interval.Reliability(failures=2, uptime_seconds=12.5, save_seconds=0.25, step_seconds=1)
    assert interval.Reliability.parse(r.to_json()) == r


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (500, True),
        ("auto", True),
        ("500", True),
        (0, False),
        ("every", False),
        (True, False),
        (2.5, False),
        (10**9, False),
    ],
)
def test_interval_steps_is_a_number_or_auto(value: object, ok: bool) -> None:
    if ok:
        config_checkpoint.CheckpointConfig.model_validate({"intervalSteps": value})
        return
    with pytest.raises(
        ValueError,
        match=r"intervalSteps\n.*whole number of steps 1\.\.100000000 " r"or 'auto', got",
    ):
        config_checkpoint.CheckpointConfig.model_validate({"intervalSteps": value})


def _scraped(m: metrics.Metrics) -> scrape.Scrape:
    """What the operator's prober reads off this registry's page."""
    return kube.contract_samples(m.render())


def test_the_operator_reads_the_workers_report() -> None:
    m = metrics.Metrics()
    m.step.set(41)
    m.reached(contract.Milestone.RENDEZVOUS)
    m.reached(contract.Milestone.FIRST_STEP)
    m.steps_run.set(3)
    m.step_seconds_sum.set(1.5)
    m.ckpt_blocked.set(0.25)
    m.chose(
        interval.Choice(
            steps=120,
            auto=True,
            save_seconds=2.5,
            step_seconds=0.25,
            mtbf_seconds=21600.0,
            failures=1,
        )
    )
    m.ckpt_step.set(40)
    m.resumed_from.set(20)
    loading = observe.progress_of(_scraped(m))
    assert loading.resumed_from is None  # not before the "loaded" milestone says it is final
    m.reached(contract.Milestone.LOADED)
    got = observe.progress_of(_scraped(m))
    assert got.step == 41 and got.steps_run == 3
    assert (got.checkpoint_step, got.resumed_from) == (40, 20)
    assert got.train_seconds == 1.5 and got.blocked_seconds == 0.25
    assert set(got.milestones) == {"rendezvous", "loaded", "first_step"}
    assert got.interval is not None and got.interval.steps == 120 and got.interval.auto
    assert (got.interval.save_seconds, got.interval.mtbf_seconds) == (2.5, 21600.0)
    assert got.interval.failures == 1


def test_a_fixed_interval_is_reported_as_fixed_and_an_old_worker_as_nothing() -> None:
    m = metrics.Metrics()
    m.chose(interval.Choice(steps=500, auto=False))
    got = observe.progress_of(_scraped(m))
    assert got.interval is not None and got.interval.steps == 500 and not got.interval.auto
    old = observe.progress_of(scrape.Scrape([scrape.Sample(contract.METRIC_STEP, (), 7.0)]))
    assert old.step == 7 and old.milestones == {} and old.interval is None
    assert old.checkpoint_step is None and old.resumed_from is None


def test_the_memory_tiers_interval_and_last_save_reach_the_status_and_describe() -> None:
    """checkpoint.memory's own interval (auto: chosen from every failure) and its last blocking
    save are rank 0's to report; the status keeps them beside checkpointInterval (the claim's),
    and `fsdpctl describe` prints them. A worker without a memory tier reports none."""
    from fsdp_operator.cli import documents, views
    from fsdp_operator.policy import decide
    from fsdp_operator.types import observed as ob

    m = metrics.Metrics()
    m.step.set(41)
    assert observe.progress_of(_scraped(m)).memory is None
    m.memory_interval.set(6)
    m.memory_save_seconds.set(0.042)
    m.memory_step.set(36)
    got = observe.progress_of(_scraped(m))
    assert got.memory == st.MemoryTier(interval_steps=6, save_seconds=0.042, sealed_step=36)
    spec = api.FSDPJobSpec.model_validate(
        {"image": "w:1", "replicas": 2, "checkpoint": {"root": "/ckpt", "claimName": "c"}}
    )
    first = st.HistoryEntry(attempt=1, started=0.0, world_size=2)
    began = st.FSDPJobStatus(
        phase=st.Phase.RUNNING, attempt=1, replicas=2, pods_created=True, history=[first]
    )
    d = decide.decide(
        ob.Observed(
            spec=spec, status=began, generation=1, now=100.0, pods=[], nodes={}, progress=got
        )
    )
    assert d.status.memory_tier == got.memory
    doc = d.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert doc["memoryTier"] == {"intervalSteps": 6, "saveSeconds": 0.042, "sealedStep": 36}
    described = views.cost_lines(documents.job_status({"status": doc}))  # as fsdpctl reads it
    assert "memory tier: every 6 steps, last save 0.042s, sealed step 36" in described


def test_the_goodput_totals_are_counters_that_only_rise() -> None:
    m = metrics.Metrics()
    m.steps_run.set(3)
    m.steps_run.set(5)
    m.steps_run.set(4)  # never: a process's total does not fall; the counter keeps 5
    m.ckpt_blocked.set(0.5)
    m.ckpt_blocked.inc(0.25)
    page = m.render()
    assert "# TYPE fsdp_train_steps_run_total counter" in page
    got = observe.progress_of(kube.contract_samples(page))
    assert got.steps_run == 5 and got.blocked_seconds == 0.75


def test_an_older_kits_goodput_gauges_are_still_read() -> None:
    """Trainers built on the kit before 0.2 serve the totals as gauges named `..._sum`."""
    page = (
        "# TYPE fsdp_train_step gauge\nfsdp_train_step 12\n"
        "# TYPE fsdp_train_steps_run gauge\nfsdp_train_steps_run 7\n"
        "# TYPE fsdp_train_step_seconds_sum gauge\nfsdp_train_step_seconds_sum 3.5\n"
        "# TYPE fsdp_checkpoint_blocked_seconds_sum gauge\nfsdp_checkpoint_blocked_seconds_sum 1\n"
    )
    got = observe.progress_of(kube.contract_samples(page))
    assert (got.step, got.steps_run, got.train_seconds, got.blocked_seconds) == (12, 7, 3.5, 1.0)
