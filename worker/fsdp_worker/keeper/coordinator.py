"""The gang's coordinator: the small TCP service through which the keepers of one attempt
agree on the generation their ranks run, who failed first, and which spare holds a node.

The keeper of node rank 0 serves it (`active`); every other keeper listens on the same port on
standby, for the operator's word when node rank 0 is lost (`promote` to a spare, `follow` to
the others). Apart from the keeper (gang.py) because it is a state machine with its own
truth-table tests (tests/unit/test_gang_coordinator.py): it starts no process, reads no file
and asks nothing of anyone; it only answers. One JSON line each way per connection
(contract/keeper.py's `ask`); no torch.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Any

from fsdp_worker import contract
from fsdp_worker.contract import gangwire
from fsdp_worker.contract.keeper import MAX_SPARE, Op, host_port
from fsdp_worker.keeper import guard

if TYPE_CHECKING:
    from fsdp_worker.keeper.gang import Keeper

DOWN_TIMEOUT_SECONDS = 60.0
"""How long a keeper waits for every node to report its ranks down before it gives up the
restart and waits for the operator (a node whose keeper died never reports); a promoted spare's
coordinator waits as long for the other nodes to rejoin."""
MAX_RECORDS = 8
"""Failures of earlier generations passed to the next one (rank 0 serves them)."""
HOLD_SECONDS = 2.0
"""How long a keeper's `state`, `down` or `done` that names the generation it knows (`known`)
is held while nothing it waits for happens (long-poll: a keeper learns of a new generation at
once, in one request per HOLD_SECONDS rather than a poll every 0.2 s). Well under the operator's
GANG_SILENT_SECONDS: a keeper waiting here is heard at least this often."""
HELD = (Op.STATE, Op.DOWN, Op.DONE)
MAX_CONNECTIONS = 2048
"""Requests served at once (a held long-poll is one: a gang of 1,024 nodes holds as many); one
more is closed unanswered (counted `busy`): a flood of connections costs the flood's sender a
retry, not the keeper a thread each."""

LOG_EVERY_SECONDS = 10.0
"""Refusals of one reason are logged once in this long (all are counted)."""

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _State:
    generation: int = 0
    final: bool = False  # a keeper escalated: nobody restarts again
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    down: dict[int, set[int]] = dataclasses.field(default_factory=dict)
    done: set[int] = dataclasses.field(default_factory=set)  # nodes whose ranks exited 0
    holders: dict[int, int] = dataclasses.field(default_factory=dict)  # node -> spare now on it
    nodes: int = 0  # pods in the gang
    started: float = dataclasses.field(default_factory=lambda: time.monotonic())
    heard: dict[int, float] = dataclasses.field(default_factory=dict)  # node -> last ask from it
    # A spare promoted to node rank 0 (`promote`): since when it gathers the other nodes'
    # keepers, the generation each reported (`rejoin`), and the failure that made it node 0
    gathering: float | None = None
    joined: dict[int, int] = dataclasses.field(default_factory=dict)
    pending: dict[str, Any] = dataclasses.field(default_factory=dict)
    refusals: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def key(self) -> tuple[Any, ...]:
        """What a held request may wait for: a change here answers every one (few changes per
        generation, so a thousand held requests are woken O(1) times each)."""
        complete = sum(1 for nodes in self.down.values() if len(nodes) >= self.nodes)
        holders = tuple(sorted(self.holders.items()))
        done = len(self.done) >= self.nodes
        return (self.generation, self.final, self.gathering is None, holders, complete, done)

    def waits(self, doc: dict[str, Any]) -> bool:
        """Whether a request that names the generation it knows has nothing new to hear yet:
        that generation still runs and, for `down`, not every node is down in its generation,
        for `done`, not every node is done."""
        if self.final or self.gathering is not None or doc.get("known") != self.generation:
            return False
        if doc.get("op") == Op.DOWN:
            return len(self.down.get(doc.get("generation", -1), ())) < self.nodes
        if doc.get("op") == Op.DONE:
            return len(self.done) < self.nodes
        return True

    def answer(self) -> dict[str, Any]:
        now = time.monotonic()
        if self.gathering is not None and now - self.gathering > DOWN_TIMEOUT_SECONDS:
            self.gathering, self.final = None, True  # a node never rejoined: the operator's
        return {
            "generation": self.generation,
            "gathering": self.gathering is not None,
            "final": self.final,
            "failures": self.failures[-MAX_RECORDS:],
            "down": {str(g): sorted(n) for g, n in self.down.items()},
            "done": len(self.done),
            "holders": {str(n): spare for n, spare in self.holders.items()},
            # seconds since each node's keeper last asked or was answered (at least every
            # HOLD_SECONDS while it keeps its ranks or waits for the others): a frozen or
            # stopped one falls silent, and
            # the operator does not wait for a restart in place it cannot take part in
            "quiet": {
                str(n): round(now - self.heard.get(n, self.started), 1) for n in range(self.nodes)
            },
            "refusals": dict(self.refusals),  # requests refused, by gangwire.Refusal
        }

    def out_of_place(self, doc: dict[str, Any]) -> gangwire.Refused | None:
        """What the gang's state refuses of an authenticated request: a node or spare it does
        not have, a generation it is not at (a report for one it is past is stale; one it
        has not reached yet, forged). None when the request may be heard."""
        op, node, generation = doc.get("op"), doc.get("node"), doc.get("generation")
        sender = doc.get("from")
        if isinstance(sender, int) and not -1 <= sender < self.nodes:
            return _refused(gangwire.Refusal.OUT_OF_RANGE, f"from={sender}, nodes={self.nodes}")
        if op in (Op.DOWN, Op.DONE, Op.REJOIN) and not _within(node, 0, self.nodes):
            return _refused(gangwire.Refusal.OUT_OF_RANGE, f"node={node}, nodes={self.nodes}")
        if op == Op.REPLACE:
            return self._replace_out_of_place(doc)
        if op in (Op.DOWN, Op.DONE, Op.FAIL) and isinstance(generation, int):
            ahead = generation > self.generation
            behind = generation < self.generation and op != Op.DOWN and not doc.get("final")
            if ahead or behind:
                why = f"{op} of generation {generation}; the gang runs {self.generation}"
                return _refused(gangwire.Refusal.STALE_GENERATION, why)
        if op == Op.FAIL and generation is None and not doc.get("final"):
            return _refused(gangwire.Refusal.MALFORMED, "generation: fail needs one, or final")
        return None

    def _replace_out_of_place(self, doc: dict[str, Any]) -> gangwire.Refused | None:
        node, spare = doc.get("node"), doc.get("spare")
        if not _within(node, 1, self.nodes):
            why = f"node={node}: replace needs 0 < node < nodes ({self.nodes})"
            return _refused(gangwire.Refusal.OUT_OF_RANGE, why)
        if not _within(spare, 0, MAX_SPARE + 1):
            return _refused(gangwire.Refusal.OUT_OF_RANGE, f"spare={spare}, at most {MAX_SPARE}")
        return None

    def replace(self, doc: dict[str, Any]) -> str:
        """The operator's `replace`: spare `spare` takes node `node`'s place in the next
        generation (its node lost, or its pod frozen); that node counts as down. Empty when
        done, else why not.

        When the other nodes are already coming down from the generation before (their ranks
        failed first: a frozen peer's ranks hang the others until their own watchdog ends
        them), the replaced node is counted down in that generation, whose failure this is,
        and the generation they wait to start is the spare's too: the replaced node would
        never report itself down there, and a new generation on top would leave every keeper
        waiting for the other's."""
        node, spare = doc.get("node"), doc.get("spare")
        if not isinstance(node, int) or not isinstance(spare, int) or node <= 0:
            return f"replace needs node > 0 (node 0 hosts this coordinator) and a spare: {doc}"
        if self.final:
            return "the gang has stopped restarting in place"
        if spare in self.holders.values():
            return f"spare {spare} already holds a node"
        given = doc.get("failure")
        record: dict[str, Any] = given if isinstance(given, dict) else {}
        # A lost node, or a pod frozen whole (Hang: its keeper fell silent); NodeLost unless
        # the operator said which.
        taken = (contract.FailureClass.NODE_LOST.value, contract.FailureClass.HANG.value)
        cls = record.get("class") if record.get("class") in taken else taken[0]
        before = self.generation - 1
        coming_down = before >= 0 and bool(set(range(self.nodes)) - self.down.get(before, set()))
        ending = before if coming_down else self.generation
        entry = {**record, "class": cls, "node": node, "generation": ending, "spare": spare}
        # one record per generation: the replaced node's, the cause the others' ends were
        # symptoms of (their first failure's words stay in its `symptom`)
        first = next((f for f in self.failures if f.get("generation") == ending), None)
        if first is not None:
            entry["symptom"] = str(first.get("message") or first.get("class") or "")[:300]
            self.failures.remove(first)
        self.failures.append(entry)
        self.down.setdefault(ending, set()).add(node)
        if not coming_down:
            self.generation += 1
            self.done.clear()
        self.holders[node] = spare
        self.heard[node] = time.monotonic()  # the spare speaks for it from now on
        return ""

    def promote(self, doc: dict[str, Any], spare: int) -> None:
        """The operator's `promote`: node rank 0 is lost (or frozen) and this spare takes its
        place, as the gang's coordinator too. Node 0's state went with it: the other nodes'
        keepers, told to `follow` this one, bring what they saw (`rejoin`)."""
        now = time.monotonic()
        given = doc.get("failure")
        self.pending = dict(given) if isinstance(given, dict) else {}
        self.generation = max(0, int(doc.get("generation") or 0))  # the operator's floor
        self.gathering, self.joined = now, {}
        self.holders = {0: spare}
        self.heard = dict.fromkeys(range(self.nodes), now)
        self._gathered()

    def rejoin(self, doc: dict[str, Any]) -> None:
        """A node's keeper, its ranks stopped, following this coordinator: the generation it
        ran and what node rank 0's coordinator last told it (failures, holders)."""
        node, generation = doc.get("node"), doc.get("generation")
        if self.gathering is None or not isinstance(node, int) or not isinstance(generation, int):
            return
        if not 0 < node < self.nodes:
            return
        self.joined[node] = generation
        failures = [f for f in doc.get("failures") or () if isinstance(f, dict)]
        if len(failures) > len(self.failures):
            self.failures = failures[-MAX_RECORDS:]
        for n, holder in (doc.get("holders") or {}).items():
            if str(n).isdigit() and int(n) > 0 and isinstance(holder, int):
                self.holders.setdefault(int(n), holder)
        self._gathered()

    def _gathered(self) -> None:
        """Every other node rejoined: the generation node 0 was lost in ends (the lost node's
        record is its cause; a first failure the others saw stays as its `symptom`), all are
        down, and the next one starts with the spare as node 0."""
        if self.gathering is None or set(range(1, self.nodes)) - self.joined.keys():
            return
        ending = max([self.generation, *self.joined.values()])
        taken = (contract.FailureClass.NODE_LOST.value, contract.FailureClass.HANG.value)
        cls = self.pending.get("class") if self.pending.get("class") in taken else taken[0]
        entry = {
            **self.pending,
            "class": cls,
            "node": 0,
            "generation": ending,
            "spare": self.holders[0],
        }
        first = next((f for f in self.failures if f.get("generation") == ending), None)
        if first is not None:
            entry["symptom"] = str(first.get("message") or first.get("class") or "")[:300]
            self.failures.remove(first)
        self.failures = [*self.failures, entry][-MAX_RECORDS:]
        self.down[ending] = set(range(self.nodes))
        self.generation = ending + 1
        self.gathering = None
        self.done.clear()


def _within(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _refused(reason: gangwire.Refusal, detail: str) -> gangwire.Refused:
    return gangwire.Refused(reason, detail)


class Coordinator(socketserver.ThreadingTCPServer):
    """Node rank 0's keeper serves the gang (`active`); every other keeper listens on standby
    for the operator's word when node rank 0 is lost: `promote` (a spare becomes node 0 and
    this coordinator) and `follow` (the others' keepers go to it). `keeper` hears both."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # every keeper asks again at once when a held answer goes out

    def __init__(
        self,
        port: int,
        nodes: int = 0,
        *,
        active: bool = True,
        keeper: Keeper | None = None,
        creds: gangwire.Credentials | None = None,
    ) -> None:
        self.state = _State(nodes=nodes)
        self.active = active
        self.keeper = keeper
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.guard = guard.Guard(creds or gangwire.Credentials("", 0), clock=time.time)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._logged: dict[gangwire.Refusal, float] = {}  # reason -> when last logged
        super().__init__(("", port), _Handler)

    def handle_line(self, line: bytes, peer: str) -> dict[str, Any]:
        """One request line from `peer` (host:port): its answer in a signed envelope, or a
        refusal (counted, logged with the peer; nothing changed)."""
        nonce = ""
        try:
            request = self.guard.admit(line)
            nonce = request.nonce
            answer = self.handle_request_doc(request.model_dump(by_alias=True))
        except gangwire.Refused as exc:
            answer = self.refuse(exc, peer)
            nonce = _nonce_of(line)
        return gangwire.reply(answer, creds=self.guard.creds, nonce=nonce)

    def refuse(self, exc: gangwire.Refused, peer: str) -> dict[str, Any]:
        """Count and log a refusal; its answer (no state: the asker may be a stranger). One
        line per reason every LOG_EVERY_SECONDS at most: a flood must not fill the pod's log."""
        now = time.monotonic()
        with self.lock:
            self.state.refusals[exc.reason] += 1
            count = self.state.refusals[exc.reason]
            quiet = now - self._logged.get(exc.reason, -LOG_EVERY_SECONDS) < LOG_EVERY_SECONDS
            if not quiet:
                self._logged[exc.reason] = now
        if not quiet:
            log.warning("keeper port: refused a request from %s: %s (%d so far)", peer, exc, count)
        return {"refused": str(exc), "reason": str(exc.reason)}

    def handle_request_doc(self, doc: dict[str, Any]) -> dict[str, Any]:
        """An authenticated request (its envelope checked: handle_line) as a dict: its effect
        and the gang's state after it, or a refusal of what the state does not allow (with the
        state). A keeper's `state`, `down` or `done` with `known` (the generation it knows) is
        held until there is news for it (_State.waits, _State.key) or HOLD_SECONDS pass;
        without `known`, answered at once."""
        with self.lock:
            st = self.state
            misplaced = st.out_of_place(doc)
            if misplaced is not None:
                st.refusals[misplaced.reason] += 1
                log.info("keeper port: refused %s", misplaced)
                return {**st.answer(), "refused": str(misplaced), "reason": misplaced.reason}
            key = st.key()
            answer = self._handle(doc)
            if st.key() != key:
                self.changed.notify_all()
            if self.active and doc.get("op") in HELD and doc.get("known") is not None:
                return _slim(self._held(doc, answer), doc)
            return answer

    def _held(self, doc: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        st, key = self.state, self.state.key()
        deadline = time.monotonic() + HOLD_SECONDS
        if not st.waits(doc):
            return answer
        while st.waits(doc) and st.key() == key and time.monotonic() < deadline:
            self.changed.wait(deadline - time.monotonic())
        sender = doc.get("from")
        if isinstance(sender, int) and 0 <= sender < st.nodes:
            st.heard[sender] = time.monotonic()
        return st.answer()

    def _handle(self, doc: dict[str, Any]) -> dict[str, Any]:
        op = doc.get("op")
        st = self.state
        if op in (Op.FOLLOW, Op.PROMOTE):
            return self._hand_over(doc)
        if not self.active:
            return {"standby": True}
        sender = doc.get("from")
        if isinstance(sender, int) and 0 <= sender < st.nodes:
            st.heard[sender] = time.monotonic()
        if op == Op.FAIL and doc.get("generation") == st.generation and not st.final:
            # The first failure of a generation is its cause; later ones are its symptoms.
            given = doc.get("failure")
            record: dict[str, Any] = given if isinstance(given, dict) else {}
            st.failures.append({**record, "generation": st.generation})
            st.final = bool(doc.get("final"))
            if not st.final:
                st.generation += 1
                st.done.clear()  # nodes that ended well start again with the others
        elif op == Op.FAIL and doc.get("final"):
            st.final = True
        elif op == Op.DOWN and isinstance(doc.get("generation"), int):
            st.down.setdefault(doc["generation"], set()).add(doc["node"])
        elif op == Op.DONE and doc.get("generation", st.generation) == st.generation:
            st.done.add(doc["node"])
        elif op == Op.REPLACE:
            refused = st.replace(doc)
            return {**st.answer(), "refused": refused} if refused else st.answer()
        elif op == Op.REJOIN:
            st.rejoin(doc)
        return st.answer()

    def _hand_over(self, doc: dict[str, Any]) -> dict[str, Any]:
        """`promote` (to a spare's keeper: it becomes node rank 0 and this coordinator, its
        ranks hosting the store at `master`) or `follow` (to another node's keeper: the gang's
        coordinator is now `coordinator`, its store `master`). Both host:port."""
        keeper, op = self.keeper, doc.get("op")
        master, coordinator = doc.get("master"), doc.get("coordinator")
        try:
            host_port(str(master))
            if op == Op.FOLLOW:
                host_port(str(coordinator))
        except ValueError:
            return {"refused": f"{op} needs master (and to follow, coordinator) as host:port"}
        if keeper is None or self.active:
            return {"refused": "this keeper is the gang's coordinator"}
        if op == Op.FOLLOW:
            keeper.follow = (str(coordinator), str(master))
            return {"following": coordinator}
        if keeper.gang.spare is None or keeper.gang.node >= 0:
            return {"refused": f"node {keeper.gang.node}'s keeper is not a waiting spare"}
        self.state.promote(doc, keeper.gang.spare)
        self.active = True
        keeper.promoted = str(master)
        return self.state.answer()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, up to MAX_CONNECTIONS at once; one more is closed."""
        if not self._slots.acquire(blocking=False):
            self.refuse(
                gangwire.Refused(gangwire.Refusal.BUSY, "too many connections"),
                _peer(client_address),
            )
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _nonce_of(line: bytes) -> str:
    """A refused request's nonce, where it has one: the refusal answers it (an asker with
    this attempt's key can read why)."""
    with contextlib.suppress(ValueError):
        doc = json.loads(line)
        if isinstance(doc, dict) and isinstance(doc.get("nonce"), str):
            return str(doc["nonce"])[:64]
    return ""


def _peer(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


def _slim(answer: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """A held request's answer, for a keeper of this release: without each node's `quiet`
    (the operator's) and with only the nodes down in `doc`'s generation. The whole answer is
    O(nodes) and a thousand keepers ask at once after every change."""
    slim = {k: v for k, v in answer.items() if k not in ("quiet", "down")}
    ended = str(doc.get("generation"))
    slim["down"] = {ended: answer["down"][ended]} if ended in answer.get("down", {}) else {}
    return slim


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0

    def handle(self) -> None:
        try:
            line = self.rfile.readline(gangwire.MAX_LINE + 1)
        except OSError:
            return
        assert isinstance(self.server, Coordinator)
        answer = self.server.handle_line(line, _peer(self.client_address))
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(answer).encode() + b"\n")
