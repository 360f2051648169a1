"""What the user sees of a slow rank (policy/slowness.py): status.slowRank with its pod, node
and slowdown, a Warning SlowRank Event when one is first named and SlowRankCleared when it goes.

No cluster and no clock: each row is what rank 0 reported and what the status and Events say.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.cli import documents, views
from fsdp_operator.policy import decide
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import NOW, make_spec, observe, pods, running_status

EARLIER = NOW - 60


def _shown(rank: int, slowdown: float = 2.04, attempt: int = 1) -> st.SlowRank:
    return st.SlowRank(
        rank=rank,
        pod=f"job-a{attempt}-{rank}",
        node=f"node-{rank}",
        slowdown=slowdown,
        since=EARLIER,
        attempt=attempt,
    )


def _events(d: decide.Decision) -> list[tuple[str, str]]:
    return [(e.type.value, e.reason) for e in d.events if e.reason.startswith("SlowRank")]


def _pass(before: st.SlowRank | None, progress: ob.Progress | None, **over: Any) -> Any:
    status = over.pop("status", None) or running_status(slow_rank=before)
    return decide.decide(observe(status=status, progress=progress, **over))


@pytest.mark.parametrize(
    ("before", "reported", "after", "events"),
    [
        pytest.param(None, ob.Progress(step=55), None, [], id="none-named-none-shown"),
        pytest.param(
            None,
            ob.Progress(step=55, slow_rank=2, slowdown=2.0371),
            st.SlowRank(
                rank=2,
                pod="job-a1-2",
                node="node-2",
                slowdown=2.04,
                since=NOW,
                attempt=1,
                since_step=55,
            ),
            [("Warning", "SlowRank")],
            id="first-named-warns",
        ),
        pytest.param(
            _shown(2),
            ob.Progress(step=55, slow_rank=2, slowdown=1.81),
            _shown(2, slowdown=1.81),
            [],
            id="still-named-updates-quietly-keeps-since",
        ),
        pytest.param(
            _shown(2),
            ob.Progress(step=55, slowdown=1.02),
            None,
            [("Normal", "SlowRankCleared")],
            id="no-longer-named-clears",
        ),
        pytest.param(_shown(2), None, _shown(2), [], id="nothing-scraped-keeps-it"),
        pytest.param(
            _shown(2),
            ob.Progress(step=55, slow_rank=3, slowdown=1.6),
            st.SlowRank(
                rank=3,
                pod="job-a1-3",
                node="node-3",
                slowdown=1.6,
                since=NOW,
                attempt=1,
                since_step=55,
            ),
            [("Normal", "SlowRankCleared"), ("Warning", "SlowRank")],
            id="another-rank-named",
        ),
    ],
)
def test_a_named_slow_rank_is_shown_and_told_once(
    before: st.SlowRank | None,
    reported: ob.Progress | None,
    after: st.SlowRank | None,
    events: list[tuple[str, str]],
) -> None:
    d = _pass(before, reported)
    assert d.status.slow_rank == after
    assert _events(d) == events


def test_the_ranks_of_one_slow_pod_taking_turns_are_one_slow_node() -> None:
    """Both ranks of a throttled pod are slow; rank 0 names whichever was slowest in its last
    window. The node stays named since its first verdict (straggler.py counts from there), with
    no Events: the e2e throttle test's swap waited 280 steps while since_step started again."""
    spec = make_spec(replicas=2, nprocPerNode=2)
    before = st.SlowRank(
        rank=2, pod="job-a1-1", node="node-1", slowdown=1.8, since=EARLIER, attempt=1, since_step=40
    )
    d = _pass(before, ob.Progress(step=75, slow_rank=3, slowdown=1.9), spec=spec)
    after = d.status.slow_rank
    assert after is not None
    assert (after.rank, after.slowdown, after.pod, after.since, after.since_step) == (
        3,
        1.9,
        "job-a1-1",
        EARLIER,
        40,
    )
    assert _events(d) == []
    # a rank of another pod is another node: named anew
    d = _pass(before, ob.Progress(step=75, slow_rank=1, slowdown=1.9), spec=spec)
    assert d.status.slow_rank is not None and d.status.slow_rank.since_step == 75
    assert _events(d) == [("Normal", "SlowRankCleared"), ("Warning", "SlowRank")]


def test_the_event_names_pod_node_and_slowdown() -> None:
    d = _pass(None, ob.Progress(step=55, slow_rank=1, slowdown=1.97))
    (event,) = [e for e in d.events if e.reason == "SlowRank"]
    assert "rank 1" in event.message and "job-a1-1" in event.message
    assert "node-1" in event.message and "1.97x" in event.message


def test_a_rank_is_found_in_its_pod_by_nproc_per_node() -> None:
    """Global rank 5 with 2 processes per pod is pod rank 2's second process."""
    spec = make_spec(replicas=4, nprocPerNode=2)
    d = _pass(None, ob.Progress(step=55, slow_rank=5, slowdown=2.0), spec=spec)
    assert d.status.slow_rank is not None
    assert (d.status.slow_rank.pod, d.status.slow_rank.node) == ("job-a1-2", "node-2")


def test_a_new_attempt_clears_the_last_attempts_slow_rank() -> None:
    """Its ranks may sit on other nodes now: the old name would point at the wrong one."""
    status = running_status(attempt=2, slow_rank=_shown(2, attempt=1))
    d = _pass(None, ob.Progress(step=55), status=status, pods=pods(attempt=2))
    assert d.status.slow_rank is None
    assert _events(d) == [("Normal", "SlowRankCleared")]


def test_a_finished_job_shows_no_slow_rank() -> None:
    status = running_status(phase=st.Phase.SUCCEEDED, slow_rank=_shown(2), finished=NOW - 5)
    d = _pass(None, ob.Progress(step=55, slow_rank=2, slowdown=2.0), status=status)
    assert d.status.slow_rank is None


def test_fsdpctl_describe_shows_the_slow_rank_as_written() -> None:
    d = _pass(None, ob.Progress(step=55, slow_rank=1, slowdown=1.97))
    doc = d.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    described = views.cost_lines(documents.job_status({"status": doc}))  # as fsdpctl reads it
    assert "slow rank: 1 (pod job-a1-1 on node node-1) computes 1.97x the others" in described
    assert not [line for line in views.cost_lines(running_status()) if "slow rank" in line]
