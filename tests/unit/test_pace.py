"""Rank 0's straggler verdict (fsdp_worker.telemetry.pace.judge) as a truth table, what it
exports (bounded series at any world size) and what the operator reads back off the page.

No torchrun here: tests/worker/test_pace.py runs the measure under real ranks.
"""

from __future__ import annotations

import pytest

from fsdp_operator.io import kube, observe
from fsdp_worker import contract
from fsdp_worker.telemetry import metrics, pace

W = (0.01, 0.01, 0.01, 0.01)  # waits: the verdict reads computes only


@pytest.mark.parametrize(
    ("computes", "named", "slow_rank", "slowdown"),
    [
        pytest.param((0.1, 0.1, 0.1, 0.1), -1, -1, 1.0, id="even-gang"),
        pytest.param((0.1, 0.2, 0.1, 0.1), -1, 1, 2.0, id="one-at-half-speed"),
        pytest.param((0.1, 0.2), -1, 1, 2.0, id="world-2-others-median-not-the-mean"),
        pytest.param((0.1, 0.125, 0.1, 0.1), -1, -1, 1.25, id="below-1.3-not-named"),
        pytest.param((0.1, 0.13, 0.1, 0.1), -1, 1, 1.3, id="at-1.3-named"),
        pytest.param((0.1, 0.12, 0.1, 0.1), 1, 1, 1.2, id="named-stays-above-1.15"),
        pytest.param((0.1, 0.11, 0.1, 0.1), 1, -1, 1.1, id="named-clears-below-1.15"),
        pytest.param((0.1, 0.1, 0.12, 0.1), 1, -1, 1.2, id="hysteresis-is-the-named-ranks-only"),
        pytest.param((0.1, 0.1, 0.1, 0.25), 1, 3, 2.5, id="another-rank-slower"),
        pytest.param((0.3,), -1, -1, 1.0, id="one-rank-has-no-peers"),
    ],
)
def test_a_rank_is_named_slow_against_the_others_median(
    computes: tuple[float, ...], named: int, slow_rank: int, slowdown: float
) -> None:
    got = pace.judge(step=20, computes=computes, waits=W[: len(computes)], named=named)
    assert got.slow_rank == slow_rank
    assert got.slowdown == pytest.approx(slowdown)


def test_a_thousand_ranks_export_four_series_not_a_thousand() -> None:
    computes = tuple(0.1 + 0.0001 * (r % 7) for r in range(1000))
    slow = tuple(2 * c if r == 617 else c for r, c in enumerate(computes))
    verdict = pace.judge(step=40, computes=slow, waits=(0.05,) * 1000)
    m = metrics.Metrics()
    verdict.export(m)
    page = m.render()
    series = [ln for ln in page.splitlines() if ln.startswith(contract.METRIC_RANK_COMPUTE + "{")]
    assert len(series) == pace.TOP_K + 1
    assert any('rank="617"' in ln for ln in series)
    assert any(f'rank="{contract.RANK_MEDIAN}"' in ln for ln in series)
    pace.judge(step=60, computes=computes, waits=(0.05,) * 1000).export(m)
    again = [ln for ln in m.render().splitlines() if 'rank="617"' in ln]
    assert again == []  # a rank that is no longer among the slowest leaves the page


def test_the_operator_reads_the_slow_rank_and_an_even_gang_as_none() -> None:
    m = metrics.Metrics()
    m.step.set(20)
    assert observe.progress_of(kube.contract_samples(m.render())).slow_rank is None  # -1
    pace.judge(step=20, computes=(0.1, 0.1, 0.2), waits=(0.1, 0.1, 0.0)).export(m)
    got = observe.progress_of(kube.contract_samples(m.render()))
    assert got.slow_rank == 2 and got.slowdown == pytest.approx(2.0)
    pace.judge(step=40, computes=(0.1, 0.1, 0.1), waits=(0.0, 0.0, 0.0), named=2).export(m)
    got = observe.progress_of(kube.contract_samples(m.render()))
    assert got.slow_rank is None and got.slowdown == pytest.approx(1.0)
