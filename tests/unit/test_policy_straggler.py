"""A slow node swapped out (policy/straggler.py; failurePolicy.swapSlowNodes with spec.spares):
a rank named slow for two verdicts in a row, with a running spare on another node, stops the
attempt as planned (the gang saves on SIGTERM), keeps its node out and loses no step; jitter, a
single verdict, no spare, a restart or a takeover under way, or a second time, do not.

No cluster and no clock: each row is what rank 0 reported and what the status and Events say.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.policy import decide, straggler
from fsdp_operator.types import api
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from tests.builders import NOW, ckpt, in_place_spec, nodes, observe, pods, running_status

SPARE_NODE = "node-5"
_SWAPPED: dict[str, Any] = {
    "rank": 2,
    "pod": "job-a1-2",
    "node": "node-2",
    "slowdown": 2.0,
    "step": 40,
    "spare": "job-a1-s0",
    "spare_node": SPARE_NODE,
}


def _spec(*, spares: int = 1, swap: bool = True) -> api.FSDPJobSpec:
    return in_place_spec(swap_slow_nodes=swap).model_copy(update={"spares": spares})


def _spare(node: str = SPARE_NODE, **over: Any) -> ob.PodView:
    fields: dict[str, Any] = {
        "name": "job-a1-s0",
        "attempt": 1,
        "rank": -1,
        "phase": ob.PodPhase.RUNNING,
        "node": node,
        "spare": 0,
        "ip": "10.0.0.20",
    }
    return ob.PodView(**{**fields, **over})


def _slow(rank: int = 2, since_step: int = 30, **over: Any) -> st.SlowRank:
    fields: dict[str, Any] = {
        "rank": rank,
        "pod": f"job-a1-{rank}",
        "node": f"node-{rank}",
        "slowdown": 2.0,
        "since": NOW - 60,
        "attempt": 1,
        "since_step": since_step,
    }
    return st.SlowRank(**{**fields, **over})


def _status(slow: st.SlowRank | None = None, **over: Any) -> st.FSDPJobStatus:
    over.setdefault("spares", st.Spares(wanted=1, running=1, next_index=1))
    over.setdefault("slow_rank", slow or _slow())
    return running_status(**over)


def _observe(**over: Any) -> ob.Observed:
    """Rank 0 names rank 2 at twice the others' compute at step 55 (named at 30: two verdicts)."""
    rank = over.pop("rank", 2)
    fields: dict[str, Any] = {
        "spec": _spec(),
        "status": _status(),
        "spares": [_spare()],
        "nodes": nodes(6),
        "progress": ob.Progress(step=55, slow_rank=rank, slowdown=2.0),
    }
    return observe(**{**fields, **over})


def _reasons(d: decide.Decision) -> list[tuple[str, str]]:
    return [(e.type.value, e.reason) for e in d.events]


def test_a_node_slow_for_two_verdicts_is_swapped_out_at_a_save_and_no_step_is_lost() -> None:
    d = decide.decide(_observe())
    s = d.status
    ended = s.history[-1]
    assert s.phase is st.Phase.RESTARTING and s.drain and ended.cause is st.Cause.STRAGGLER
    assert ended.swap == st.Swap(
        rank=2,
        pod="job-a1-2",
        node="node-2",
        slowdown=2.0,
        step=55,
        spare="job-a1-s0",
        spare_node=SPARE_NODE,
    )
    assert [e.node for e in s.excluded_nodes] == ["node-2"]
    # planned: no budget charged, no failure counted; every pod and the spare stop (SIGTERM)
    assert s.restarts.total == 0 and s.reliability.failures == 0 and s.last_failure is None
    assert {p.name for p in d.delete} == {*(f"job-a1-{r}" for r in range(4)), "job-a1-s0"}
    assert all(p.grace_seconds is None for p in d.delete)  # the pods' own grace: they save
    # The saves done and the pods gone: attempt 2 resumes from the step the swap began at.
    after = decide.decide(
        observe(spec=_spec(), status=s, pods=[], nodes=nodes(6), checkpoint=ckpt(55), progress=None)
    )
    assert after.launch is not None and after.launch.excluded_nodes == ("node-2",)
    assert after.status.attempt == 2 and after.status.resumed_from_step == 55
    assert after.status.history[0].steps_lost == 0


def test_the_swap_says_which_rank_pod_node_and_slowdown() -> None:
    d = decide.decide(_observe())
    said = [e for e in d.events if e.reason == "Straggler"]
    assert [e.type.value for e in said] == ["Normal"]
    assert said[0].message == (
        "swapped out: rank 2 (pod job-a1-2 on node node-2) computed 2.00x as long per step as "
        "the other ranks' median from step 30 to step 55; the gang saves a checkpoint now and "
        "starts again without node node-2, on node node-5 where spare pod job-a1-s0 stood"
    )


def test_node_rank_0_is_swapped_like_any_other() -> None:
    """The whole gang is recreated: no pod has to take the coordinator's place."""
    d = decide.decide(_observe(status=_status(_slow(rank=0)), rank=0))
    assert d.status.history[-1].swap is not None
    assert d.status.history[-1].swap.node == "node-0"


def _running_on(d: decide.Decision) -> bool:
    return d.status.phase is st.Phase.RUNNING and d.status.history[-1].swap is None


def _in_place_restart(resumed: float | None) -> st.InPlaceRestart:
    failure = st.Failure(cause=st.Cause.CRASH, rank=1, pod="job-a1-1", time=NOW - 21)
    return st.InPlaceRestart(generation=0, failure=failure, detected=NOW - 20, resumed=resumed)


def _entry(**over: Any) -> list[st.HistoryEntry]:
    return [st.HistoryEntry(attempt=1, started=NOW - 200, world_size=4, **over)]


@pytest.mark.parametrize(
    "over",
    [
        pytest.param({"status": _status(_slow(since_step=50))}, id="one-verdict-only"),
        pytest.param(
            {"progress": ob.Progress(step=55, slow_rank=2, slowdown=1.35)},
            id="named-but-under-the-swap-line",
        ),
        pytest.param(
            {"progress": ob.Progress(step=55, slowdown=1.02)}, id="jitter-cleared-by-rank-0"
        ),
        pytest.param(
            {
                "status": _status(phase=st.Phase.PENDING),
                "pods": pods(r1={"phase": ob.PodPhase.PENDING}),
            },
            id="attempt-not-all-running",
        ),
        pytest.param({"status": _status(drain=True)}, id="draining"),
        pytest.param(
            {"status": _status(history=_entry(restarts_in_place=[_in_place_restart(None)]))},
            id="restart-in-place-not-training-yet",
        ),
        pytest.param(
            {
                "status": _status(
                    spares=st.Spares(wanted=1, running=1, next_index=1, replaced=["job-a1-1"])
                )
            },
            id="takeover-lost-pod-still-there",
        ),
        pytest.param(
            {"status": _status(history=_entry(swap=st.Swap(**_SWAPPED)))},
            id="swapped-once-this-attempt",
        ),
        pytest.param({"status": _status(step=55, slow_rank=None)}, id="none-named"),
    ],
)
def test_no_swap_while_not_persistent_or_something_is_under_way(over: dict[str, Any]) -> None:
    d = decide.decide(_observe(**over))
    assert d.status.history[-1].cause is None and d.status.history[-1].ended is None
    assert not [e for e in d.events if e.reason in ("Straggler", "SlowNodeKept")], d.events
    assert not d.status.excluded_nodes


def test_a_restart_in_place_that_trains_again_does_not_hold_a_swap_back() -> None:
    done = _status(history=_entry(restarts_in_place=[_in_place_restart(NOW - 10)]))
    assert decide.decide(_observe(status=done)).status.history[-1].cause is st.Cause.STRAGGLER


@pytest.mark.parametrize(
    ("over", "why"),
    [
        pytest.param(
            {"spares": []}, "no spare was running on another node to swap it for", id="no-spare"
        ),
        pytest.param(
            {"spares": [_spare(phase=ob.PodPhase.PENDING, node=None)]},
            "no spare was running on another node to swap it for",
            id="spare-not-running-yet",
        ),
        pytest.param(
            {"spares": [_spare(node="node-2")]},
            "no spare was running on another node to swap it for",
            id="spare-on-the-slow-node",
        ),
        pytest.param(
            {"spec": _spec(spares=0), "spares": []},
            "no spare to swap it for (spec.spares is 0)",
            id="spares-0",
        ),
    ],
)
def test_a_slow_node_kept_says_why_once(over: dict[str, Any], why: str) -> None:
    d = decide.decide(_observe(**over))
    assert _running_on(d)
    slow = d.status.slow_rank
    assert slow is not None and slow.kept == why
    kept = [e for e in d.events if e.reason == "SlowNodeKept"]
    assert [e.type.value for e in kept] == ["Warning"]
    assert kept[0].message == (
        "rank 2 (pod job-a1-2 on node node-2) computes 2.00x as long per step as the other "
        f"ranks' median since step 30; its node is not swapped out: {why}"
    )
    again = decide.decide(_observe(**{**over, "status": d.status}))
    assert _running_on(again) and "SlowNodeKept" not in [r for _, r in _reasons(again)]


def test_a_rank_slow_again_after_its_swap_is_not_swapped_again() -> None:
    """The slowness followed the rank to another node: its data or its work, not the node."""
    before = st.HistoryEntry(
        attempt=1,
        started=NOW - 400,
        ended=NOW - 200,
        cause=st.Cause.STRAGGLER,
        world_size=4,
        swap=st.Swap(**_SWAPPED),
    )
    now = st.HistoryEntry(attempt=2, started=NOW - 200, world_size=4)
    status = _status(_slow(attempt=2), attempt=2, history=[before, now])
    d = decide.decide(_observe(status=status, pods=pods(attempt=2), spares=[_spare(attempt=2)]))
    assert _running_on(d)
    assert d.status.slow_rank is not None
    assert d.status.slow_rank.kept.startswith("rank 2 was swapped out of node node-2 in attempt 1")


def test_the_swap_line_is_above_rank_0s_naming_line() -> None:
    assert straggler.SWAP_SLOWDOWN > 1.3 and straggler.CONFIRM_STEPS == contract.PACE_WINDOW_STEPS


def test_without_swap_slow_nodes_the_status_says_why_and_no_event_is_added() -> None:
    """The SlowRank Event was the news; a job that did not ask for swaps gets no new one."""
    d = decide.decide(_observe(spec=_spec(swap=False)))
    assert _running_on(d) and not [e for e in d.events if e.reason == "SlowNodeKept"]
    assert d.status.slow_rank is not None
    assert d.status.slow_rank.kept == "failurePolicy.swapSlowNodes is off"


@pytest.mark.parametrize(
    ("swap", "spares", "every"),
    [(True, 1, 5.0), (False, 1, 15.0), (True, 0, 15.0)],
    ids=["swaps-with-a-spare", "swaps-off", "no-spare"],
)
def test_a_job_that_swaps_slow_nodes_is_scraped_at_least_every_5s(
    swap: bool, spares: int, every: float
) -> None:
    """Rank 0's verdicts come each 20 steps; read at the progress deadline's quarter (15 s at
    60 s, up to a minute), the e2e throttle test named the slow pod 49 steps after its throttle."""
    from fsdp_operator.run import reconcile

    spec = in_place_spec(swap_slow_nodes=swap, progress_deadline_seconds=60)
    spec = spec.model_copy(update={"spares": spares})
    obs = _observe(spec=spec, pods=pods(r0={"ip": "10.244.0.5"}))
    target = reconcile._probe_target(obs, decide.decide(obs), max_interval=60.0, job_uid=None)
    assert target is not None and target.every == every
