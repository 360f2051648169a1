"""A node suspected, not lost (policy/suspicion.py): a kubelet that stops renewing its Lease
under a gang that trains on is said once (NodeSuspect) and kept in status.suspectNodes, and
cleared when it renews again; a node the job is judged to have lost is not called suspect."""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import decide
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import NOW, make_spec, nodes, observe, pods, running_status


def _silent(*silent: int) -> list[ob.NodeView]:
    views = nodes()
    for i in silent:
        views[i] = dataclasses.replace(views[i], lease_silent_seconds=12.0, lease_quiet=True)
    return views


def _events(d: decide.Decision, reason: str) -> list[str]:
    return [e.message for e in d.events if e.reason == reason]


def test_a_silent_lease_under_a_gang_that_trains_is_said_once_then_cleared() -> None:
    d = decide.decide(observe(nodes=_silent(2), progress=ob.Progress(step=51)))
    assert d.failure is None and d.status.suspect_nodes == ["node-2"]
    (said,) = _events(d, "NodeSuspect")
    assert "node node-2 stopped renewing its Lease (12s) while the job trains on" in said
    assert "nodeLossGraceSeconds (30s)" in said
    assert next(e for e in d.events if e.reason == "NodeSuspect").type is decide.EventType.WARNING
    # the next pass: still silent, not said again
    again = running_status(step=51, last_progress_time=NOW, suspect_nodes=["node-2"])
    d = decide.decide(observe(nodes=_silent(2), status=again, progress=ob.Progress(step=52)))
    assert d.status.suspect_nodes == ["node-2"] and not _events(d, "NodeSuspect")
    # it renews again
    d = decide.decide(observe(status=again, progress=ob.Progress(step=52)))
    assert d.status.suspect_nodes == [] and not _events(d, "NodeSuspect")
    assert _events(d, "NodeSuspectCleared") == ["node node-2 renews its Lease again: not lost"]


def test_a_node_the_job_lost_is_not_called_suspect() -> None:
    """The job made no step since the node went silent: lost at once (detect), no suspicion."""
    stopped = running_status(last_progress_time=NOW - 13, suspect_nodes=["node-1"])
    d = decide.decide(observe(nodes=_silent(1), status=stopped, progress=ob.Progress(step=50)))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert d.status.suspect_nodes == []
    assert not _events(d, "NodeSuspect") and not _events(d, "NodeSuspectCleared")


def test_only_the_nodes_of_the_attempts_running_pods_are_suspect() -> None:
    """A silent node that runs none of this attempt's pods (node-3: its pod went to node-0;
    node-9: another job's) is none of this job's business; a suspect whose pod left says so."""
    gang = pods(r3={"node": "node-0"})
    was = running_status(step=51, last_progress_time=NOW, suspect_nodes=["node-9"])
    views = [*_silent(1, 3), ob.NodeView(name="node-9", ready=True, lease_silent_seconds=30.0)]
    d = decide.decide(observe(nodes=views, pods=gang, status=was, progress=ob.Progress(step=52)))
    assert d.status.suspect_nodes == ["node-1"]
    assert _events(d, "NodeSuspectCleared") == ["node node-9 no longer runs this attempt's pods"]


def test_a_suspended_or_relaunched_job_keeps_no_suspects() -> None:
    """Its pods go (suspend), or a new attempt's nodes are judged afresh (a resize)."""
    was = running_status(step=51, last_progress_time=NOW, suspect_nodes=["node-2"])
    d = decide.decide(observe(spec=make_spec(suspend=True), nodes=_silent(2), status=was))
    assert d.status.suspect_nodes == [] and not _events(d, "NodeSuspectCleared")
    restarting = running_status(
        phase=st.Phase.RESTARTING, next_attempt_at=NOW - 1, suspect_nodes=["node-2"]
    )
    d = decide.decide(observe(nodes=_silent(2), status=restarting))
    assert d.status.attempt == 2 and d.status.suspect_nodes == []


def test_a_finished_job_keeps_no_suspects() -> None:
    done = running_status(phase=st.Phase.SUCCEEDED, suspect_nodes=["node-2"])
    d = decide.decide(observe(nodes=_silent(2), status=done))
    assert d.status.suspect_nodes == [] and not _events(d, "NodeSuspectCleared")
