"""The in-place gang's coordinator tells how long each node's keeper has been quiet; the
operator reads from that whether a restart in place can still come (deadlines.asks_the_gang)."""

from __future__ import annotations

import concurrent.futures
import socket
import time
import urllib.error
import urllib.request

import pytest

from fsdp_operator.types import observed
from fsdp_worker.keeper import gang, torchrun_argv
from fsdp_worker.keeper.coordinator import DOWN_TIMEOUT_SECONDS, Coordinator
from fsdp_worker.keeper.silence import NoAnswer


def test_the_coordinator_tells_how_long_each_keeper_has_been_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    coordinator = Coordinator(0, nodes=3)
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
    """The operator's replace says why (spares.take_over): a frozen pod's is a Hang, charged to
    the application; anything else it records as NodeLost, as before."""
    coordinator = Coordinator(0, nodes=2)
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
    coordinator = Coordinator(0, nodes=2)
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


class _Waiting:
    """What the coordinator's standby reads of its keeper: its gang, and where it hears."""

    def __init__(self, node: int, spare: int | None = None) -> None:
        self.gang = gang.Gang(
            restarts=4, coordinator="job-a1-0:29501", node=node, nodes=3, spare=spare
        )
        self.follow: tuple[str, str] | None = None
        self.promoted: str | None = None


def test_a_spare_promoted_to_node_rank_0_gathers_the_others_then_restarts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node rank 0 (the coordinator) is lost in generation 2. The operator promotes spare 5
    (its standby becomes the coordinator) and tells nodes 1 and 2 to follow it; they bring
    what node 0's coordinator last said. Once both rejoined, generation 2 ends with node 0's
    NodeLost (node 1's first failure its symptom) and generation 3 starts, every node down."""
    clock = [10.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    spare, node1 = _Waiting(-1, spare=5), _Waiting(1)
    standby = Coordinator(0, nodes=3, active=False, keeper=spare)  # type: ignore[arg-type]
    other = Coordinator(0, nodes=3, active=False, keeper=node1)  # type: ignore[arg-type]
    try:
        assert standby.handle_request_doc({"op": "state"}) == {"standby": True}
        bad = standby.handle_request_doc({"op": "promote", "master": "no-port"})
        assert "master" in bad["refused"] and spare.promoted is None
        refused = other.handle_request_doc({"op": "promote", "master": "10.0.0.9:29500"})
        assert "not a waiting spare" in refused["refused"], refused
        lost = {"class": "NodeLost", "pod": "job-a1-0", "message": "node n0 stopped renewing"}
        doc = {"op": "promote", "master": "10.0.0.9:29500", "failure": lost, "generation": 1}
        answer = standby.handle_request_doc(doc)
        assert spare.promoted == "10.0.0.9:29500" and answer["gathering"], answer
        assert answer["holders"] == {"0": 5}
        again = standby.handle_request_doc(doc)
        assert "coordinator" in again["refused"]
        follow = {"op": "follow", "coordinator": "10.0.0.9:29501", "master": "10.0.0.9:29500"}
        assert other.handle_request_doc(follow) == {"following": "10.0.0.9:29501"}
        assert node1.follow == ("10.0.0.9:29501", "10.0.0.9:29500")
        crash = {"class": "Other", "message": "gloo: connection reset", "generation": 2}
        earlier = {"class": "Crash", "message": "rank 3 exited 1", "generation": 0}
        clock[0] = 12.0
        standby.handle_request_doc(
            {
                "op": "rejoin",
                "node": 1,
                "generation": 2,
                "failures": [earlier, crash],
                "holders": {"2": 4},
            }
        )
        waiting = standby.handle_request_doc({"op": "state", "from": 1})
        assert waiting["gathering"] and waiting["quiet"] == {"0": 2.0, "1": 0.0, "2": 2.0}
        done = standby.handle_request_doc({"op": "rejoin", "node": 2, "generation": 1})
        assert not done["gathering"] and done["generation"] == 3, done
        assert done["down"] == {"2": [0, 1, 2]} and done["holders"] == {"0": 5, "2": 4}
        (first, record) = done["failures"]
        assert first == earlier
        assert (record["generation"], record["node"], record["class"]) == (2, 0, "NodeLost")
        assert record["spare"] == 5 and record["symptom"] == "gloo: connection reset"
    finally:
        standby.server_close()
        other.server_close()


def test_a_promoted_spare_that_is_never_joined_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node the operator could not tell to follow never rejoins: past the keepers' down
    timeout the new coordinator says `final`, and every keeper waits for the operator."""
    clock = [10.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    spare = _Waiting(-1, spare=0)
    standby = Coordinator(0, nodes=3, active=False, keeper=spare)  # type: ignore[arg-type]
    try:
        standby.handle_request_doc({"op": "promote", "master": "10.0.0.9:29500"})
        standby.handle_request_doc({"op": "rejoin", "node": 1, "generation": 0})
        clock[0] += DOWN_TIMEOUT_SECONDS - 1
        assert standby.handle_request_doc({"op": "state"})["gathering"]
        clock[0] += 2
        answer = standby.handle_request_doc({"op": "state"})
        assert answer["final"] and not answer["gathering"], answer
    finally:
        standby.server_close()


def test_a_lone_node_rank_0_taken_by_a_spare_starts_past_the_operators_count() -> None:
    """A one-node gang has no one to rejoin: the promote starts the next generation at once,
    past the restarts in place the operator counted (the keepers' budget goes on)."""
    spare = _Waiting(-1, spare=1)
    standby = Coordinator(0, nodes=1, active=False, keeper=spare)  # type: ignore[arg-type]
    try:
        answer = standby.handle_request_doc(
            {"op": "promote", "master": "10.0.0.9:29500", "generation": 2}
        )
        assert not answer["gathering"] and answer["generation"] == 3, answer
    finally:
        standby.server_close()


def test_torchruns_store_moves_with_node_rank_0() -> None:
    argv = [
        "python",
        "-m",
        "torch.distributed.run",
        "--rdzv-endpoint=a.svc:29500",
        "-m",
        "x",
        "--rdzv-endpoint=mine",
    ]
    moved = torchrun_argv.with_endpoint(argv, "10.0.0.9:29500")
    assert moved[3] == "--rdzv-endpoint=10.0.0.9:29500" and moved[-1] == "--rdzv-endpoint=mine"
    assert torchrun_argv.rendezvous(moved) == "10.0.0.9:29500"
    assert (
        torchrun_argv.rendezvous(["--rdzv_endpoint", "h:1"]) == "h:1"
        and torchrun_argv.rendezvous([]) == ""
    )


@pytest.mark.parametrize(
    ("answer", "settled"),
    [
        ({"generation": 5, "holders": {"1": 3}}, "lost"),  # spare 3 holds node 1 now
        ({"generation": 5, "holders": {}}, "moved"),  # a peer failed first: a symptom
        ({"generation": 4}, "exited"),  # this node's ranks failed first
    ],
)
def test_ranks_that_end_after_their_node_was_given_to_a_spare_do_not_restart(
    monkeypatch: pytest.MonkeyPatch, answer: dict[str, object], settled: str
) -> None:
    """A lost node's pod runs on (its kubelet stopped). When the gang restarts without it, its
    ranks end on their own (their peers went) before its keeper's next ask: the keeper reads
    that its node is held by a spare and stops, instead of joining the next generation beside
    the spare as a second node 1 (seen in the spares soak as a restart that never resumed)."""
    g = gang.Gang(restarts=9, coordinator="10.0.0.5:29501", node=1, nodes=2)
    keeper = gang.Keeper(g, ["python", "-m", "torch.distributed.run", "-m", "x"])
    monkeypatch.setattr(keeper, "_ask", lambda doc, **kw: answer)
    assert keeper._settle("exited", 1, 4) == settled


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_spare_standing_by_answers_the_readiness_probe_then_frees_the_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A spare carries rank 0's readiness probe (for when it becomes node rank 0); while it
    stands by its keeper answers it, so the pod is Ready for the hours it may wait, and the
    port is free again once it stops standing by (its rank 0's metrics server takes it)."""
    port = _free_port()
    monkeypatch.setenv("FSDP_METRICS_PORT", str(port))
    monkeypatch.setattr("fsdp_worker.keeper.standby.warm_imports", lambda: None)
    nobody = f"127.0.0.1:{_free_port()}"  # no coordinator answers there: nobody gives a node
    keeper = gang.Keeper(
        gang.Gang(restarts=1, coordinator=nobody, node=-1, nodes=2, spare=0, listen=0), ["true"]
    )
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(keeper._stand_by)

    def probe(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, ""

    deadline = time.monotonic() + 10
    while True:
        try:
            status, text = probe("/progress?within=10&startup=60")
            break
        except urllib.error.URLError:
            assert time.monotonic() < deadline, "the spare never answered its readiness probe"
            time.sleep(0.05)
    assert status == 200 and "standing by" in text
    assert probe("/metrics")[0] == 404
    keeper.stopping = True
    assert waiting.result(timeout=10) is None
    with socket.socket() as s:  # what rank 0's metrics server does next
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", port))


def test_a_keepers_reports_lost_on_a_busy_network_are_said_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each keeper's first `fail`, `down` and `done` is lost on the way (one request that timed
    out on a loaded machine): the coordinator still hears them. A lost `done` had held both
    keepers in the exit barrier for a minute after training ended (the operator judged a
    hang), a lost `down` or `fail` ended restarts in place."""
    monkeypatch.setattr(gang, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(gang, "DOWN_TIMEOUT_SECONDS", 1.0)
    coordinator = Coordinator(0, nodes=2)
    lost: set[str] = set()

    def lossy(doc: dict[str, object], **_: object) -> dict[str, object] | NoAnswer:
        op = str(doc["op"])
        if op != "state" and op not in lost:
            lost.add(op)
            return NoAnswer.LATE  # timed out on the way: the coordinator never heard it
        return coordinator.handle_request_doc({**doc, "from": 1})

    keeper = gang.Keeper(
        gang.Gang(restarts=3, coordinator="127.0.0.1:1", node=1, nodes=2), ["true"]
    )
    monkeypatch.setattr(keeper, "_hear", lossy)
    try:
        failure = {"class": "RuntimeError", "rank": 1}
        keeper._report({"op": "fail", "generation": 0, "failure": failure, "final": False})
        assert coordinator.state.generation == 1 and len(coordinator.state.failures) == 1
        coordinator.handle_request_doc({"op": "down", "generation": 0, "node": 0, "from": 0})
        assert keeper._next_generation(0) == (1, [{**failure, "generation": 0}])
        coordinator.handle_request_doc({"op": "done", "generation": 1, "node": 0, "from": 0})
        assert keeper._finished(1)
        assert coordinator.state.done == {0, 1}, "node 1's `done` never arrived"
        assert lost == {"fail", "down", "done"}
    finally:
        coordinator.server_close()


def test_a_held_down_is_answered_once_every_node_is_down_with_a_count_not_a_list() -> None:
    """A keeper's `down` is its report and its wait in one exchange: held until the last node
    is down, then answered with how many are (`downs`), not which: a thousand-entry list to
    each of a thousand keepers at once was most of what the coordinator sent at 1,024 nodes.
    A held `state` carries no `down` map at all (it grew by a generation at every restart)."""
    coordinator = Coordinator(0, nodes=2)
    try:
        coordinator.handle_request_doc({"op": "fail", "generation": 0, "failure": {}})
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            held = {"op": "down", "generation": 0, "known": 1}
            first = pool.submit(coordinator.handle_request_doc, {**held, "node": 0, "from": 0})
            watch = pool.submit(coordinator.handle_request_doc, {"op": "state", "known": 1})
            time.sleep(0.2)
            assert not first.done(), "answered before node 1 was down"
            last = coordinator.handle_request_doc({**held, "node": 1, "from": 1})
            answer = first.result(timeout=1)
            assert watch.result(timeout=3)["down"] == {}
        for a in (answer, last):
            assert a["downs"] == {"0": 2} and a["down"] == {} and a["generation"] == 1, a
        assert gang.Keeper(
            gang.Gang(restarts=3, coordinator="127.0.0.1:1", node=1, nodes=2), ["true"]
        )._down_in(answer, 0)
    finally:
        coordinator.server_close()
