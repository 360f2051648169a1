"""The hostile keeper table: what a stranger (another namespace's pod, another job, an earlier
attempt, a replayer) may send to a gang's keeper port (29501), over a real socket to a real
Coordinator (node rank 0's, and a standby spare's). Every case is refused with its reason,
counted, and changes nothing: not the generation, the failures, the nodes down or done, the
spares' places, nor a standby keeper's coordinator. Correctly signed requests still work, and
`ask` does not obey an answer that is not its gang's (a reused IP)."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsdp_worker.contract import gangwire, keeper
from fsdp_worker.contract.gangwire import Refusal
from fsdp_worker.keeper.coordinator import Coordinator

MASTER = b"the operator's master key, 32 b"
JOB, ATTEMPT = "6b1c8a52-0000-4000-8000-000000000001", 3
KEY = gangwire.attempt_key(MASTER, JOB, ATTEMPT)
CREDS = gangwire.Credentials(JOB, ATTEMPT, KEY)
OTHER_JOB = gangwire.Credentials(JOB, ATTEMPT, gangwire.attempt_key(MASTER, "another-uid", 3))
EARLIER = gangwire.Credentials(JOB, ATTEMPT, gangwire.attempt_key(MASTER, JOB, ATTEMPT - 1))
NODES = 3


@dataclasses.dataclass
class StandbyKeeper:
    """What a standby Coordinator changes on its keeper for `follow` and `promote`."""

    gang: keeper.Gang
    follow: tuple[str, str] | None = None
    promoted: str | None = None


@dataclasses.dataclass
class Gang:
    active: Coordinator
    standby: Coordinator
    spare: StandbyKeeper

    def snapshot(self) -> tuple[Any, ...]:
        st = self.active.state
        return (
            st.generation,
            st.final,
            json.dumps(st.failures, sort_keys=True),
            {g: sorted(n) for g, n in st.down.items()},
            sorted(st.done),
            dict(st.holders),
            self.spare.follow,
            self.spare.promoted,
            self.standby.active,
        )

    def refusals(self) -> dict[str, int]:
        return {**self.active.state.refusals, **self.standby.state.refusals}


def _serve(coordinator: Coordinator) -> int:
    serve = lambda: coordinator.serve_forever(poll_interval=0.01)  # noqa: E731
    threading.Thread(target=serve, daemon=True).start()
    return int(coordinator.server_address[1])


@pytest.fixture
def gang() -> Iterator[Gang]:
    """Node rank 0's coordinator at generation 1 (node 1 failed in generation 0, all down),
    and spare 0's keeper on standby."""
    active = Coordinator(0, NODES, creds=CREDS)
    spare_gang = keeper.Gang(restarts=3, coordinator="10.0.0.1:29501", node=-1, nodes=3, spare=0)
    spare = StandbyKeeper(spare_gang)
    standby = Coordinator(0, NODES, active=False, keeper=spare, creds=CREDS)  # type: ignore[arg-type]
    for c in (active, standby):
        _serve(c)
    at = ("127.0.0.1", active.server_address[1])
    keeper.ask(at, {"op": "fail", "generation": 0, "failure": {"node": 1}, "from": 1}, creds=CREDS)
    for node in range(NODES):
        keeper.ask(at, {"op": "down", "generation": 0, "node": node}, creds=CREDS)
    yield Gang(active, standby, spare)
    for c in (active, standby):
        c.shutdown()
        c.server_close()


def _raw(port: int, line: bytes) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(line + b"\n")
        with sock.makefile("rb") as fh:
            answer = json.loads(fh.readline())
    assert isinstance(answer, dict)
    return answer


def _signed(
    op: str, creds: gangwire.Credentials = CREDS, *, ts: float | None = None, **fields: Any
) -> bytes:
    doc = gangwire.request(
        keeper.Op(op), fields, creds=creds, now=time.time() if ts is None else ts
    )
    return json.dumps(doc).encode()


def _edited(op: str, change: Callable[[dict[str, Any]], None], **fields: Any) -> bytes:
    """A signed request changed after signing (`change`), then signed again: the right key,
    the wrong content."""
    doc = json.loads(_signed(op, **fields))
    change(doc)
    return json.dumps(gangwire.sign(doc, KEY)).encode()


def _unsigned(op: str, **fields: Any) -> bytes:
    doc = json.loads(_signed(op, **fields))
    del doc["mac"]
    return json.dumps(doc).encode()


def _bad_mac(op: str, **fields: Any) -> bytes:
    doc = json.loads(_signed(op, **fields))
    doc["mac"] = "0" * 64
    return json.dumps(doc).encode()


CONFIG_ERROR = {"class": "ConfigError", "message": "forged: the job fails with my words"}
FOLLOW_ME = {"coordinator": "10.66.6.6:29501", "master": "10.66.6.6:29500"}
# which keeper, the line, the reason refused
CASES = [
    pytest.param(
        "active",
        lambda: _unsigned("fail", generation=1, failure=CONFIG_ERROR),
        Refusal.BAD_MAC,
        id="no-mac",
    ),
    pytest.param(
        "active",
        lambda: _bad_mac("fail", generation=1, failure=CONFIG_ERROR),
        Refusal.BAD_MAC,
        id="bad-mac",
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", OTHER_JOB, generation=1, failure=CONFIG_ERROR),
        Refusal.BAD_MAC,
        id="another-jobs-key",
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", EARLIER, generation=1, final=True),
        Refusal.BAD_MAC,
        id="earlier-attempts-key",
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", OTHER_JOB, generation=1, failure=CONFIG_ERROR, final=True),
        Refusal.BAD_MAC,
        id="forged-fail-config-error",
    ),
    pytest.param(
        "active", lambda: _unsigned("fail", final=True), Refusal.BAD_MAC, id="forged-fail-final"
    ),
    pytest.param(
        "active",
        lambda: _signed("replace", EARLIER, node=1, spare=0),
        Refusal.BAD_MAC,
        id="forged-replace",
    ),
    pytest.param(
        "standby",
        lambda: _signed("follow", OTHER_JOB, **FOLLOW_ME),
        Refusal.BAD_MAC,
        id="forged-follow-to-a-stranger",
    ),
    pytest.param(
        "standby",
        lambda: _bad_mac("promote", master="10.66.6.6:29500"),
        Refusal.BAD_MAC,
        id="forged-promote",
    ),
    pytest.param(
        "standby", lambda: _unsigned("follow", **FOLLOW_ME), Refusal.BAD_MAC, id="unsigned-follow"
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", generation=1, ts=time.time() - 120),
        Refusal.STALE_TS,
        id="old-ts",
    ),
    pytest.param(
        "active",
        lambda: _signed("down", generation=1, node=1, ts=time.time() + 120),
        Refusal.STALE_TS,
        id="future-ts",
    ),
    pytest.param(
        "active",
        lambda: _edited("fail", lambda d: d.update(job="another-uid"), generation=1),
        Refusal.WRONG_JOB,
        id="wrong-job-uid",
    ),
    pytest.param(
        "active",
        lambda: _edited("fail", lambda d: d.update(attempt=2), generation=1),
        Refusal.WRONG_ATTEMPT,
        id="wrong-attempt",
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", generation=0, failure=CONFIG_ERROR),
        Refusal.STALE_GENERATION,
        id="earlier-generation-fail",
    ),
    pytest.param(
        "active",
        lambda: _signed("down", generation=5, node=1),
        Refusal.STALE_GENERATION,
        id="later-generation-down",
    ),
    pytest.param(
        "active",
        lambda: _signed("done", generation=0, node=1),
        Refusal.STALE_GENERATION,
        id="earlier-generation-done",
    ),
    pytest.param(
        "active",
        lambda: _signed("down", generation=1, node=NODES),
        Refusal.OUT_OF_RANGE,
        id="node-out-of-range",
    ),
    pytest.param(
        "active",
        lambda: _signed("down", generation=1, node=-1),
        Refusal.OUT_OF_RANGE,
        id="negative-node",
    ),
    pytest.param(
        "active",
        lambda: _signed("done", generation=1, node=99),
        Refusal.OUT_OF_RANGE,
        id="done-from-a-stranger-id",
    ),
    pytest.param(
        "active",
        lambda: _signed("state", **{"from": 50}),
        Refusal.OUT_OF_RANGE,
        id="sender-out-of-range",
    ),
    pytest.param(
        "active",
        lambda: _signed("replace", node=1, spare=keeper.MAX_SPARE + 1),
        Refusal.OUT_OF_RANGE,
        id="spare-out-of-range",
    ),
    pytest.param(
        "active",
        lambda: _signed("replace", node=1, spare=-1),
        Refusal.OUT_OF_RANGE,
        id="negative-spare",
    ),
    pytest.param(
        "active",
        lambda: _signed("replace", node=0, spare=0),
        Refusal.OUT_OF_RANGE,
        id="replace-node-0",
    ),
    pytest.param(
        "active",
        lambda: _signed("rejoin", node=7, generation=1),
        Refusal.OUT_OF_RANGE,
        id="rejoin-node-out-of-range",
    ),
    pytest.param(
        "active",
        lambda: _edited("state", lambda d: d.update(op="reboot")),
        Refusal.UNKNOWN_OP,
        id="unknown-op",
    ),
    pytest.param(
        "active", lambda: b'{"v": 1, "op": "fail", ', Refusal.MALFORMED, id="malformed-json"
    ),
    pytest.param(
        "active", lambda: b'[{"v": 1, "op": "fail"}]', Refusal.MALFORMED, id="not-an-object"
    ),
    pytest.param(
        "active",
        lambda: b'{"pad": "' + b"x" * gangwire.MAX_LINE + b'"}',
        Refusal.OVERSIZED,
        id="oversized-line",
    ),
    pytest.param(
        "active",
        lambda: _edited("fail", lambda d: d.update(v=2), generation=1),
        Refusal.BAD_VERSION,
        id="wrong-version",
    ),
    pytest.param(
        "active",
        lambda: _signed("down", generation=1, node="1"),
        Refusal.MALFORMED,
        id="node-as-a-string",
    ),
    pytest.param(
        "active",
        lambda: _signed("down", generation=1, node=True),
        Refusal.MALFORMED,
        id="node-as-a-bool",
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", generation=1.0, final=True),
        Refusal.MALFORMED,
        id="generation-as-a-float",
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", generation=1, failure="ConfigError"),
        Refusal.MALFORMED,
        id="failure-as-a-string",
    ),
    pytest.param(
        "active", lambda: _signed("state", reboot=True), Refusal.MALFORMED, id="an-unknown-field"
    ),
    pytest.param(
        "active",
        lambda: _signed("fail", failure=CONFIG_ERROR),
        Refusal.MALFORMED,
        id="fail-without-generation",
    ),
]


@pytest.mark.parametrize(("where", "line", "reason"), CASES)
def test_a_hostile_request_is_refused_counted_and_changes_nothing(
    gang: Gang, where: str, line: Callable[[], bytes], reason: Refusal
) -> None:
    before, counted = gang.snapshot(), gang.refusals()
    target = gang.active if where == "active" else gang.standby
    answer = _raw(int(target.server_address[1]), line())
    assert answer["reason"] == reason and answer["refused"].startswith(f"{reason}: "), answer
    assert gang.snapshot() == before
    assert gang.refusals() == {**counted, reason: counted.get(reason, 0) + 1}
    assert "failures" not in answer or where == "active"  # a stranger learns no state


def test_a_replayed_request_is_refused_and_counted(gang: Gang) -> None:
    """A report seen once (here: node 1's ranks of generation 1 are down) is not heard again."""
    line, port = _signed("down", generation=1, node=1), int(gang.active.server_address[1])
    assert "refused" not in _raw(port, line)
    before = gang.snapshot()
    answer = _raw(port, line)
    assert answer["reason"] == Refusal.REPLAY and gang.snapshot() == before
    assert gang.refusals() == {Refusal.REPLAY: 1}


def test_down_counts_the_gangs_members_not_how_many_ids(gang: Gang) -> None:
    """Generation 1 is down only when nodes 0, 1 and 2 say so: stray ids never count."""
    at = ("127.0.0.1", int(gang.active.server_address[1]))
    for node in (0, 1):
        answer = keeper.ask(at, {"op": "down", "generation": 1, "node": node}, creds=CREDS)
    for stray in (3, 4, -1):
        refused = keeper.ask(at, {"op": "down", "generation": 1, "node": stray}, creds=CREDS)
        assert refused["reason"] == Refusal.OUT_OF_RANGE
    assert answer["down"]["1"] == [0, 1]


def test_signed_requests_of_the_gang_and_the_operator_still_work(gang: Gang) -> None:
    at = ("127.0.0.1", int(gang.active.server_address[1]))
    spare_at = ("127.0.0.1", int(gang.standby.server_address[1]))
    answer = keeper.ask(at, {"op": "state", "from": 0}, creds=CREDS)
    assert answer["generation"] == 1 and answer["down"] == {"0": [0, 1, 2]}
    fail = {"op": "fail", "generation": 1, "failure": {"node": 2}, "from": 2}
    assert keeper.ask(at, fail, creds=CREDS)["generation"] == 2
    replace = {"op": "replace", "node": 2, "spare": 1, "failure": {"class": "Hang"}}
    assert keeper.ask(at, replace, creds=CREDS)["holders"] == {"2": 1}
    follow = {"op": "follow", **FOLLOW_ME}
    assert keeper.ask(spare_at, follow, creds=CREDS) == {"following": FOLLOW_ME["coordinator"]}
    assert gang.spare.follow == (FOLLOW_ME["coordinator"], FOLLOW_ME["master"])
    assert gang.refusals() == {}


def test_a_refusal_reaches_the_asker_that_holds_the_key(gang: Gang) -> None:
    """The operator's replace that the gang's state refuses comes back signed, with why."""
    at = ("127.0.0.1", int(gang.active.server_address[1]))
    answer = keeper.ask(at, {"op": "replace", "node": 1, "spare": 10_000}, creds=CREDS)
    assert answer["reason"] == Refusal.OUT_OF_RANGE and "spare=10000" in answer["refused"]


@pytest.mark.parametrize(
    "stranger",
    [OTHER_JOB, EARLIER, gangwire.Credentials(JOB, ATTEMPT)],
    ids=["job", "attempt", "unsigned"],
)
def test_ask_does_not_obey_an_answer_that_is_not_its_gangs(
    gang: Gang, stranger: gangwire.Credentials
) -> None:
    """A keeper whose coordinator's IP was reused by another job's pod (or an earlier
    attempt's, or one that signs nothing) reads its answer as no answer."""
    impostor = Coordinator(0, NODES, creds=stranger)
    port = _serve(impostor)
    try:
        with pytest.raises(ValueError, match="not from this gang|another request"):
            keeper.ask(("127.0.0.1", port), {"op": "state"}, creds=CREDS)
    finally:
        impostor.shutdown()
        impostor.server_close()


class AllTaken:
    """A connection cap with every slot taken (a served request's release changes nothing)."""

    def acquire(self, blocking: bool = True) -> bool:
        return False

    def release(self) -> None:
        pass


def test_a_busy_keeper_closes_connections_past_its_cap(
    gang: Gang, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_CONNECTIONS at once, a connection is closed unanswered and counted."""
    monkeypatch.setattr(gang.active, "_slots", AllTaken())
    with socket.create_connection(("127.0.0.1", gang.active.server_address[1]), timeout=5) as s:
        s.sendall(_signed("state") + b"\n")
        assert s.makefile("rb").readline() == b""
    deadline = time.monotonic() + 5
    while gang.refusals() != {Refusal.BUSY: 1}:
        assert time.monotonic() < deadline, gang.refusals()
        time.sleep(0.01)


def test_a_refusal_is_logged_with_the_peers_address_once_per_reason_a_while(
    gang: Gang, caplog: pytest.LogCaptureFixture
) -> None:
    """Who sent it, and why refused; a flood of the same logs one line (all are counted)."""
    port = int(gang.active.server_address[1])
    with caplog.at_level(logging.WARNING, logger="fsdp_worker.keeper.coordinator"):
        for _ in range(5):
            _raw(port, _unsigned("fail", final=True))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "from 127.0.0.1:" in line and "bad-mac" in line, line
    assert gang.refusals() == {Refusal.BAD_MAC: 5}
