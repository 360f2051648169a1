"""The in-place gang's coordinator tells how long each node's keeper has been quiet; the
operator reads from that whether a restart in place can still come (detect.asks_the_gang)."""

from __future__ import annotations

import pytest

from fsdp_operator import observed
from fsdp_worker import gang


def test_the_coordinator_tells_how_long_each_keeper_has_been_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(gang.time, "monotonic", lambda: clock[0])
    coordinator = gang.Coordinator(0, nodes=3)
    try:
        coordinator.handle_request_doc({"op": "state", "from": 0})
        clock[0] = 104.0
        coordinator.handle_request_doc({"op": "state", "from": 1})
        coordinator.handle_request_doc({"op": "state", "from": -1})  # a spare: no node yet
        clock[0] = 130.0
        answer = coordinator.handle_request_doc({"op": "state", "from": 0})
        # node 2's keeper never asked: quiet since the coordinator started
        assert answer["quiet"] == {"0": 0.0, "1": 26.0, "2": 30.0}
        health = observed.GangHealth.of(answer)
        assert not health.restarting and health.silent == {1: 26.0, 2: 30.0}
        assert health.why_not() == "keepers silent: node 1 for 26s, node 2 for 30s"
        # a spare given node 2 speaks for it from then on
        coordinator.handle_request_doc({"op": "replace", "node": 2, "spare": 0})
        coordinator.handle_request_doc({"op": "state", "from": 1})
        answer = coordinator.handle_request_doc({"op": "state"})
        assert answer["quiet"] == {"0": 0.0, "1": 0.0, "2": 0.0}
        assert observed.GangHealth.of(answer).restarting
    finally:
        coordinator.server_close()


def test_an_answer_without_quiet_times_is_read_as_all_there() -> None:
    """A coordinator of an older image says nothing of its keepers: the grace is kept."""
    assert observed.GangHealth.of({"generation": 2, "final": False}).restarting
    assert observed.GangHealth.of({"quiet": {"x": 9.0, "1": "long"}}).restarting


@pytest.mark.parametrize(
    ("given", "recorded"),
    [({}, "NodeLost"), ({"class": "Hang"}, "Hang"), ({"class": "OutOfMemory"}, "NodeLost")],
)
def test_a_replace_is_recorded_as_a_lost_node_or_a_frozen_pods_hang(
    given: dict[str, str], recorded: str
) -> None:
    """The operator's replace says why (decide._take_over): a frozen pod's is a Hang, charged
    to the application; anything else it records as NodeLost, as before."""
    coordinator = gang.Coordinator(0, nodes=2)
    try:
        doc = {"op": "replace", "node": 1, "spare": 3, "failure": {"pod": "job-a1-1", **given}}
        answer = coordinator.handle_request_doc(doc)
        (record,) = answer["failures"]
        assert (record["class"], record["pod"], record["spare"]) == (recorded, "job-a1-1", 3)
        assert answer["holders"] == {"1": 3} and answer["generation"] == 1
    finally:
        coordinator.server_close()


def test_a_replace_after_the_others_failed_first_joins_their_generation() -> None:
    """Node 1's pod froze; node 0's ranks hung on it and their watchdog ended them first, so
    the gang is coming down from generation 0 when the operator's replace arrives. The frozen
    node counts down there (it never would itself), the spare starts generation 1 with node 0,
    and generation 0 has one record, the frozen pod's Hang (node 0's end its symptom)."""
    coordinator = gang.Coordinator(0, nodes=2)
    try:
        hung = {"class": "Hang", "message": "rank 0: no step for 10s", "rank": 0}
        coordinator.handle_request_doc({"op": "fail", "generation": 0, "failure": hung})
        coordinator.handle_request_doc({"op": "down", "generation": 0, "node": 0})
        frozen = {"class": "Hang", "pod": "job-a1-1", "message": "node rank 1's keeper silent"}
        answer = coordinator.handle_request_doc(
            {"op": "replace", "node": 1, "spare": 3, "failure": frozen}
        )
        assert "refused" not in answer, answer
        assert answer["generation"] == 1 and answer["down"] == {"0": [0, 1]}, answer
        (record,) = answer["failures"]
        assert (record["generation"], record["class"], record["pod"]) == (0, "Hang", "job-a1-1")
        assert record["spare"] == 3 and record["symptom"] == "rank 0: no step for 10s"
        # generation 1 trains (every node came down from 0); node 1's node is lost: that is
        # a failure of generation 1, and generation 2 follows
        lost = coordinator.handle_request_doc({"op": "replace", "node": 1, "spare": 4})
        assert "refused" not in lost and lost["generation"] == 2, lost
        assert lost["down"]["1"] == [1] and lost["holders"] == {"1": 4}, lost
        assert [(f["generation"], f["class"]) for f in lost["failures"]] == [
            (0, "Hang"),
            (1, "NodeLost"),
        ]
    finally:
        coordinator.server_close()
