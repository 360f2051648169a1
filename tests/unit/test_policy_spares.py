"""Warm spares (policy/spares.py; spec.spares): made beside a running gang, and taking a lost or
frozen pod's place in a restart in place; a refused takeover recreates the gang.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pydantic
import pytest

from fsdp_operator.policy import deadlines, decide, decision, launch, spares
from fsdp_operator.types import api
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract
from tests.builders import (
    NOW,
    SCRAPED,
    in_place_progress,
    in_place_record,
    in_place_spec,
    make_spec,
    nodes,
    observe,
    pods,
    running_status,
)


def _spare_spec(spares: int = 1) -> api.FSDPJobSpec:
    return in_place_spec().model_copy(update={"spares": spares})


def _spare(index: int = 0, node: str = "node-5", **over: Any) -> ob.PodView:
    fields: dict[str, Any] = {
        "name": f"job-a1-s{index}",
        "attempt": 1,
        "rank": -1,
        "phase": ob.PodPhase.RUNNING,
        "node": node,
        "spare": index,
        "ip": f"10.0.0.{20 + index}",
    }
    fields.update(over)
    return ob.PodView(**fields)


def _spare_status(**over: Any) -> st.FSDPJobStatus:
    return running_status(spares=st.Spares(wanted=1, next_index=1), **over)


def test_spares_need_restarts_in_place_and_are_made_beside_a_running_gang() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"spares=1 but failurePolicy"):
        make_spec(spares=1)
    d = decide.decide(
        observe(
            spec=_spare_spec(2), status=running_status(spares=st.Spares(wanted=2)), nodes=nodes(7)
        )
    )
    assert d.spares == (0, 1) and d.status.spares is not None
    assert (d.status.spares.next_index, d.status.spares.pending) == (2, 2)
    # Made a moment ago and not seen yet: not made twice.
    again = decide.decide(observe(spec=_spare_spec(2), status=d.status, nodes=nodes(7)))
    assert again.spares == ()
    # One runs, one ended: the ended one goes and a new number replaces it.
    ended = _spare(1, phase=ob.PodPhase.FAILED)
    later = decide.decide(
        observe(
            spec=_spare_spec(2),
            status=d.status,
            now=NOW + launch.EXPECT_SECONDS,
            spares=[_spare(0), ended],
            nodes=nodes(7),
        )
    )
    assert [x.name for x in later.delete] == ["job-a1-s1"] and later.spares == (2,)
    assert later.status.spares is not None and later.status.spares.running == 1
    # A slow watch had one made twice: the surplus goes.
    three = [_spare(0), _spare(2), _spare(3)]
    extra = decide.decide(
        observe(
            spec=_spare_spec(2), status=later.status, now=NOW + 100, spares=three, nodes=nodes(7)
        )
    )
    assert [x.name for x in extra.delete] == ["job-a1-s3"] and extra.spares == ()


def test_a_lost_node_is_taken_over_by_a_spare_without_touching_the_gang() -> None:
    obs = observe(
        spec=_spare_spec(),
        status=_spare_status(),
        nodes=nodes(6, down={2: NOW - 31}),
        pods=pods(r0={"ip": "10.0.0.5"}),
        spares=[_spare(0)],
    )
    d = decide.decide(obs)
    assert d.takeover == decision.Takeover(
        spare="job-a1-s0",
        index=0,
        node_rank=2,
        lost="job-a1-2",
        coordinator="10.0.0.5:29501",
        master="10.0.0.5:29500",
        spare_at="10.0.0.20:29501",
        failure={
            "class": "NodeLost",
            "time": NOW - 31,
            "rank": 2,
            "pod": "job-a1-2",
            "message": d.takeover.failure["message"] if d.takeover else "",
            "nodeName": "node-2",
            "detected": NOW,
        },
    )
    assert d.launch is None and d.delete == () and d.status.attempt == 1
    assert d.status.phase is st.Phase.RUNNING and d.status.restarts.total == 0
    assert d.status.spares is not None and d.status.spares.takeovers == 1
    assert [e.node for e in d.status.excluded_nodes] == ["node-2"]
    assert [e.reason for e in d.events if e.type is decision.EventType.WARNING] == ["SpareTakeover"]
    # The next pass, the lost pod not gone yet: handled, not a second takeover or a restart.
    again = decide.decide(dataclasses.replace(obs, status=d.status))
    assert again.takeover is None and again.launch is None and again.failure is None
    # The coordinator refused: the gang is recreated as without spares.
    refused = d.status.model_copy(deep=True)
    assert refused.spares is not None
    refused.spares.refused, refused.spares.replaced = "job-a1-2", []
    d = decide.decide(dataclasses.replace(obs, status=refused))
    assert d.takeover is None and d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert {x.name for x in d.delete} == {f"job-a1-{r}" for r in range(4)} | {"job-a1-s0"}


def _addressed(**over: Any) -> list[ob.PodView]:
    return pods(**{f"r{r}": {"ip": f"10.0.0.{5 + r}", **over.get(f"r{r}", {})} for r in range(4)})


def test_node_rank_0s_place_goes_to_a_spare_that_becomes_the_coordinator() -> None:
    """Node rank 0's node is lost: its keeper was the gang's coordinator and its ranks hosted
    the store. The spare is promoted to both, and the three other keepers follow it."""
    spare = _spare(0, ip="10.0.0.9")
    d = decide.decide(
        observe(
            spec=_spare_spec(),
            status=_spare_status(),
            spares=[spare],
            nodes=nodes(6, down={0: NOW - 31}),
            pods=_addressed(),
        )
    )
    t = d.takeover
    assert t is not None, d.failure
    assert (t.node_rank, t.lost, t.coordinator, t.master) == (
        0,
        "job-a1-0",
        "10.0.0.9:29501",
        "10.0.0.9:29500",
    )
    assert t.followers == ("10.0.0.6:29501", "10.0.0.7:29501", "10.0.0.8:29501")
    assert t.generation == 0 and t.failure["class"] == "NodeLost" and t.failure["rank"] == 0
    assert d.launch is None and d.delete == () and d.status.restarts.total == 0
    assert [e.node for e in d.status.excluded_nodes] == ["node-0"]


@pytest.mark.parametrize(
    ("spare", "gang"),
    [
        pytest.param(_spare(0, ip="10.0.0.9", phase=ob.PodPhase.PENDING), {}, id="spare-pending"),
        pytest.param(_spare(0, ip=None), {}, id="spare-without-an-address"),
        pytest.param(_spare(0, ip="10.0.0.9"), {"r2": {"ip": None}}, id="a-follower-unreachable"),
        pytest.param(
            _spare(0, ip="10.0.0.9"),
            {"r3": {"phase": ob.PodPhase.PENDING}},
            id="a-follower-not-running",
        ),
    ],
)
def test_no_running_spare_or_follower_means_a_recreated_gang(
    spare: ob.PodView, gang: dict[str, Any]
) -> None:
    d = decide.decide(
        observe(
            spec=_spare_spec(),
            status=_spare_status(),
            spares=[spare],
            nodes=nodes(6, down={0: NOW - 31}),
            pods=_addressed(**gang),
        )
    )
    assert d.takeover is None and d.failure is not None and d.launch is not None


def _frozen_obs(quiet: dict[str, float], spare_node: str = "node-5") -> ob.Observed:
    """Past a hang's deadline and its evidence grace, the coordinator answered with `quiet`."""
    spec = _spare_spec()
    late = NOW - spec.failure_policy.progress_deadline_seconds
    late -= deadlines.HANG_EVIDENCE_GRACE_SECONDS + 1
    return observe(
        spec=spec,
        status=_spare_status(last_progress_time=late),
        progress=None,
        scrape=SCRAPED,
        pods=pods(r0={"ip": "10.0.0.5"}),
        nodes=nodes(6),
        spares=[_spare(0, node=spare_node)],
        gang=ob.GangHealth.of({"quiet": quiet}),
    )


def test_a_frozen_pods_place_is_taken_by_a_spare_as_a_hang() -> None:
    """Node rank 2's keeper is silent past the deadline (its pod frozen whole): the spare takes
    its rank in a restart in place, recorded as a Hang of that pod (its node is not blamed);
    the operator no longer waits for a restart in place the frozen ranks cannot join."""
    d = decide.decide(_frozen_obs({"0": 0.2, "1": 0.2, "2": 14.0, "3": 0.2}))
    assert d.takeover is not None, d.failure
    t = d.takeover
    assert (t.spare, t.node_rank, t.lost, t.coordinator) == (
        "job-a1-s0",
        2,
        "job-a1-2",
        "10.0.0.5:29501",
    )
    assert t.failure["class"] == contract.FailureClass.HANG.value
    assert (t.failure["pod"], t.failure["nodeName"], t.failure["rank"]) == ("job-a1-2", "node-2", 2)
    assert "no step progress" in t.failure["message"]
    assert "node rank 2's keeper silent for 14s" in t.failure["message"]
    assert "not restarted in place" not in t.failure["message"]
    assert d.launch is None and d.delete == () and d.status.attempt == 1
    assert d.status.restarts.total == 0 and d.status.excluded_nodes == []
    assert d.status.spares is not None and d.status.spares.replaced == ["job-a1-2"]
    (event,) = [e for e in d.events if e.type is decision.EventType.WARNING]
    assert event.reason == "SpareTakeover" and event.message.startswith("Hang: "), event


@pytest.mark.parametrize(
    "quiet",
    [
        pytest.param({"0": 0.2, "1": 9.0, "2": 9.0}, id="two-keepers-silent"),
        pytest.param({"0": 0.2, "1": 0.2}, id="none-silent-but-past-the-grace"),
    ],
)
def test_a_hang_no_single_spare_can_mend_recreates_the_gang(quiet: dict[str, float]) -> None:
    obs = _frozen_obs(quiet)
    if not ob.GangHealth.of({"quiet": quiet}).silent:  # all there: past the in-place grace too
        over = NOW - obs.spec.failure_policy.progress_deadline_seconds - 60
        obs = dataclasses.replace(obs, status=_spare_status(last_progress_time=over))
    d = decide.decide(obs)
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
    d = decide.decide(obs)
    t = d.takeover
    assert t is not None and (t.node_rank, t.lost, t.coordinator) == (
        0,
        "job-a1-0",
        "10.0.0.9:29501",
    )
    assert (
        t.failure["class"] == "Hang"
        and "did not answer (10.0.0.5:29501: timed out" in (t.failure["message"])
    )
    assert d.status.excluded_nodes == []


def test_a_spare_on_the_frozen_pods_node_does_not_take_its_place() -> None:
    d = decide.decide(_frozen_obs({"0": 0.2, "2": 14.0}, spare_node="node-2"))
    assert d.takeover is None and d.failure is not None and d.failure.cause is st.Cause.HANG


def test_a_frozen_pods_takeover_arrives_as_a_hang_restart_in_place() -> None:
    """The coordinator's record of that replace: a Hang (application budget) of the frozen pod,
    not of the spare that holds its rank now."""
    frozen = {
        "class": contract.FailureClass.HANG.value,
        "pod": "job-a1-2",
        "nodeName": "node-2",
        "spare": 0,
        "message": "node rank 2's keeper silent",
    }
    d = _after_replace(in_place_record(0, **frozen))
    failure = d.status.last_failure
    assert failure is not None and failure.cause is st.Cause.HANG
    assert (failure.pod, failure.node) == ("job-a1-2", "node-2")
    assert d.status.restarts.application == 1 and d.status.restarts.infrastructure == 0


def _after_replace(record: Any) -> decide.Decision:
    """The pass after the coordinator recorded a replace: spare 0 holds node rank 2 on node-5."""
    return decide.decide(
        observe(
            spec=_spare_spec(),
            status=_spare_status(),
            pods=pods(r2={"name": "job-a1-s0", "node": "node-5"}),
            nodes=nodes(6),
            progress=in_place_progress(1, record),
        )
    )


def test_a_takeover_arrives_as_a_node_lost_restart_in_place() -> None:
    """The coordinator's record of the replace (gang.py): charged as NodeLost (infrastructure),
    kept under the lost pod and node, not the spare that holds the rank now."""
    lost = {
        "class": contract.FailureClass.NODE_LOST.value,
        "pod": "job-a1-2",
        "nodeName": "node-2",
        "spare": 0,
    }
    d = _after_replace(in_place_record(0, **lost))
    failure = d.status.last_failure
    assert failure is not None and failure.cause is st.Cause.NODE_LOST
    assert (failure.pod, failure.node) == ("job-a1-2", "node-2")
    assert d.status.restarts.infrastructure == 1 and d.status.restarts.application == 0


def test_a_spare_pod_waits_without_a_node_rank() -> None:
    from fsdp_operator.render import templates

    job = templates.JobRef(namespace="ns", name="job", uid="u1")
    pod = templates.spare_pod(
        job, _spare_spec(), decision.Launch(attempt=3, replicas=4, resume_path=""), index=2
    )
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


def test_a_finished_jobs_spares_go() -> None:
    done = [dataclasses.replace(p, phase=ob.PodPhase.SUCCEEDED, exit_code=0) for p in pods()]
    d = decide.decide(
        observe(
            spec=_spare_spec(),
            status=_spare_status(),
            pods=done,
            spares=[_spare(0)],
            nodes=nodes(6),
        )
    )
    assert d.status.phase is st.Phase.SUCCEEDED and [x.name for x in d.delete] == ["job-a1-s0"]
    again = decide.decide(
        observe(spec=_spare_spec(), status=d.status, pods=done, spares=[_spare(0)], nodes=nodes(6))
    )
    assert [x.name for x in again.delete] == ["job-a1-s0"]


def test_a_refused_takeover_is_kept_in_the_same_status_and_the_gang_recreated_next() -> None:
    """The coordinator refused (reconcile.py asked it before the status write): the pass's one
    status patch says so, nothing is handed over, and the next pass recreates the gang."""
    obs = observe(
        spec=_spare_spec(),
        status=_spare_status(),
        nodes=nodes(6, down={2: NOW - 31}),
        pods=pods(r0={"ip": "10.0.0.5"}),
        spares=[_spare(0)],
    )
    d = decide.decide(obs)
    assert d.takeover is not None
    said = spares.refused(d, "spare 0 already holds a node")
    sp = said.status.spares
    assert said.takeover is None and sp is not None
    assert (sp.refused, sp.replaced, sp.takeovers) == ("job-a1-2", [], 1)
    assert said.events[-1] == decision.Event(
        decision.EventType.WARNING,
        "SpareTakeoverRefused",
        "job-a1-2: spare 0 already holds a node; the gang is recreated",
    )
    assert d.status.spares is not None and d.status.spares.replaced == ["job-a1-2"]  # unchanged
    again = decide.decide(dataclasses.replace(obs, status=said.status))
    assert again.takeover is None and again.failure is not None
    assert again.failure.cause is st.Cause.NODE_LOST and again.status.attempt == 2


def test_spares_come_with_the_launch_they_are_made_from() -> None:
    """apply() makes the spares from the Decision alone: the running attempt's launch (its
    resume point, its excluded nodes) comes with them, and only with them."""
    excluded = [st.ExcludedNode(node="node-6", until=NOW + 60)]
    status = running_status(
        spares=st.Spares(wanted=2), excluded_nodes=excluded, resume_path="/ckpt/step-40"
    )
    d = decide.decide(observe(spec=_spare_spec(2), status=status, nodes=nodes(7)))
    made = d.spare_launch
    assert d.spares == (0, 1) and made is not None
    assert (made.attempt, made.replicas, made.resume_path) == (1, 4, "/ckpt/step-40")
    assert made.excluded_nodes == ("node-6",)
    again = decide.decide(observe(spec=_spare_spec(2), status=d.status, nodes=nodes(7)))
    assert again.spares == () and again.spare_launch is None


# --- a frozen pod suspected before the deadline (policy/frozen.py) ---------------------------


def _renewing(renewed: dict[int, float], period: float = 1.0) -> list[ob.NodeView]:
    """Six nodes whose Leases the operator saw renewed at NOW - renewed[i] (i absent: never)."""
    return [
        dataclasses.replace(
            n,
            lease_renewed=NOW - renewed[i] if i in renewed else None,
            lease_period=period if i in renewed else None,
        )
        for i, n in enumerate(nodes(6))
    ]


def _suspect_obs(
    quiet: dict[str, float] | None,
    *,
    stalled: float = 6.0,
    renewed: dict[int, float] | None = None,
    spares: list[ob.PodView] | None = None,
) -> ob.Observed:
    """No step seen for `stalled` seconds (well before the 10 s deadline); the coordinator
    answered with `quiet` (None: not asked)."""
    every = {i: 0.4 for i in range(6)}
    return observe(
        spec=_spare_spec(),
        status=_spare_status(last_progress_time=NOW - stalled),
        progress=None,
        scrape=SCRAPED,
        pods=pods(r0={"ip": "10.0.0.5"}),
        nodes=_renewing(every if renewed is None else renewed),
        spares=[_spare(0)] if spares is None else spares,
        gang=None if quiet is None else ob.GangHealth.of({"quiet": quiet}),
    )


def test_a_frozen_pod_is_taken_over_seconds_after_its_keeper_fell_silent() -> None:
    """No step for 6 s, node rank 1's keeper silent for 5.5 s, and its node renewed its Lease
    0.4 s ago: the pod is frozen, not lost. The spare takes its place now, not after the 10 s
    progress deadline, its evidence grace and the in-place grace (27 s)."""
    before = _suspect_obs(None)
    assert deadlines.asks_the_gang(before) == "10.0.0.5"  # who is silent?
    assert not deadlines.asks_the_gang(_suspect_obs(None, stalled=4.0))
    d = decide.decide(_suspect_obs({"0": 0.3, "1": 5.5, "2": 0.3, "3": 0.3}))
    t = d.takeover
    assert t is not None, d.failure
    assert (t.spare, t.node_rank, t.lost) == ("job-a1-s0", 1, "job-a1-1")
    assert t.failure["class"] == contract.FailureClass.HANG.value
    message = t.failure["message"]
    assert "no step progress for 6s" in message, message
    assert "node rank 1's keeper silent for 6s while its node node-1 renewed" in message, message
    assert message.count("keeper silent") == 1, message
    assert d.launch is None and d.status.attempt == 1 and d.status.excluded_nodes == []


@pytest.mark.parametrize(
    ("quiet", "over"),
    [
        pytest.param({"1": 5.5}, {"renewed": {0: 0.4, 1: 6.5, 2: 0.4, 3: 0.4}}, id="node-lost"),
        pytest.param({"1": 5.5}, {"renewed": {}}, id="leases-unread"),
        pytest.param({"1": 5.5}, {"spares": []}, id="no-spare"),
        pytest.param({"1": 5.5}, {"spares": [_spare(0, node="node-1")]}, id="spare-on-its-node"),
        pytest.param({"1": 5.5}, {"stalled": 3.0}, id="the-gang-steps"),
        pytest.param({"1": 5.5, "2": 5.5}, {}, id="two-silent"),
        pytest.param({"1": 4.0}, {}, id="not-silent-long-enough"),
    ],
)
def test_no_early_suspect_where_a_node_may_be_lost_or_nothing_can_take_its_place(
    quiet: dict[str, float], over: dict[str, Any]
) -> None:
    """Before the deadline nothing is decided unless a spare can take a pod that is frozen for
    sure: a node that renewed nothing since its keeper fell silent may be lost (the Lease path
    says NodeLost and excludes it), a Lease the operator cannot read says nothing, and a gang
    that steps, or several silent keepers, are not one frozen pod."""
    d = decide.decide(_suspect_obs({"0": 0.3, **quiet}, **over))
    assert d.takeover is None and d.failure is None, (d.takeover, d.failure)
    assert d.launch is None and d.status.attempt == 1


def test_a_stalled_gang_with_a_spare_is_asked_again_each_second() -> None:
    """The pass wakes when the early ask falls due and, while the gang makes no step, each
    KEEPER_RECHECK_SECONDS: a keeper silent since the freeze is seen within a second of
    GANG_SILENT_SECONDS."""
    assert deadlines.next_deadline(_suspect_obs(None, stalled=2.0)) == NOW + 3.0
    stalled = deadlines.next_deadline(_suspect_obs(None, stalled=6.0))
    assert stalled == NOW + deadlines.KEEPER_RECHECK_SECONDS


def test_no_early_suspect_while_a_promoted_spare_gathers_the_other_keepers() -> None:
    """Node rank 0 was frozen and a spare promoted in its place: until every other keeper has
    heard the operator's `follow` and rejoined, their silence at the new coordinator is the
    takeover's own, not a second frozen pod (the goodput soak's false suspect)."""
    quiet = {"quiet": {"0": 0.3, "1": 5.5}, "gathering": True}
    obs = dataclasses.replace(_suspect_obs(None), gang=ob.GangHealth.of(quiet))
    d = decide.decide(obs)
    assert d.takeover is None and d.failure is None, (d.takeover, d.failure)


def _late(seconds: float | None, **over: Any) -> ob.Observed:
    """_suspect_obs, the coordinator (node rank 0's keeper, on node-0) accepting the operator's
    asks and answering none for `seconds` in a row (None: it refused)."""
    health = ob.GangHealth(
        answered=False,
        error="10.0.0.5:29501: accepted, then: timed out",
        late_seconds=seconds,
    )
    over.setdefault("spares", [_spare(0, ip="10.0.0.9")])  # a coordinator needs an address
    return dataclasses.replace(_suspect_obs(None, **over), gang=health, pods=_addressed())


def test_a_frozen_node_rank_0_is_taken_over_seconds_after_its_coordinator_fell_silent() -> None:
    """No step for 6 s; the coordinator has accepted asks and answered none for 2.5 s while
    node-0 renewed its Lease 0.4 s ago: node rank 0's pod is frozen. The spare becomes the
    coordinator now, not after the 10 s deadline and its graces."""
    d = decide.decide(_late(2.5))
    t = d.takeover
    assert t is not None, d.failure
    assert (t.spare, t.node_rank, t.lost, t.coordinator) == (
        "job-a1-s0",
        0,
        "job-a1-0",
        "10.0.0.9:29501",
    )
    assert t.failure["class"] == contract.FailureClass.HANG.value
    message = t.failure["message"]
    assert "no step progress for 6s" in message, message
    said = "node rank 0's keeper, the gang's coordinator, accepted asks and answered none for 2s"
    assert said in message and "node-0 renewed its Lease 0.4s ago" in message, message
    assert message.count("gang's coordinator") == 1, message
    assert d.launch is None and d.status.attempt == 1 and d.status.excluded_nodes == []


@pytest.mark.parametrize(
    ("late", "over"),
    [
        pytest.param(None, {}, id="refused-not-late"),
        pytest.param(1.5, {"renewed": {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}}, id="late-once"),
        pytest.param(2.5, {"renewed": {0: 3.0, 1: 0.4, 2: 0.4, 3: 0.4}}, id="node-may-be-lost"),
        pytest.param(2.5, {"renewed": {}}, id="leases-unread"),
        pytest.param(2.5, {"spares": []}, id="no-spare"),
        pytest.param(
            2.5, {"spares": [_spare(0, node="node-0", ip="10.0.0.9")]}, id="spare-on-its-node"
        ),
        pytest.param(2.5, {"stalled": 3.0}, id="the-gang-steps"),
    ],
)
def test_no_early_suspect_of_the_coordinator_unless_its_pod_is_frozen_for_sure(
    late: float | None, over: dict[str, Any]
) -> None:
    """A coordinator that refuses (its process is gone: a crash's path) or was late once (a
    slow moment), a node that renewed nothing since the first late ask (maybe lost: the Lease
    path's), Leases unread, no spare elsewhere, or a gang that steps: nothing before the
    deadline."""
    d = decide.decide(_late(late, **over))
    assert d.takeover is None and d.failure is None, (d.takeover, d.failure)
    assert d.launch is None and d.status.attempt == 1
