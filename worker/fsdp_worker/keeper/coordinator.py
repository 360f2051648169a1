"""The gang's coordinator: the small TCP service through which the keepers of one attempt
agree on the generation their ranks run, who failed first, and which spare holds a node.

The keeper of node rank 0 serves it (`active`); every other keeper listens on the same port on
standby, for the operator's word when node rank 0 is lost (`promote` to a spare, `follow` to
the others). Apart from the keeper (gang.py) because it is a state machine with its own
truth-table tests (tests/unit/test_gang_coordinator.py; the state itself is gangstate.py): it
starts no process, reads no file and asks nothing of anyone; it only answers. One JSON line each
way per connection (contract/keeper.py's `ask`), served on one event loop (lineserver.py); no
torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from fsdp_worker.contract import gangwire
from fsdp_worker.contract.keeper import Op, host_port
from fsdp_worker.keeper import gangstate, guard, lineserver
from fsdp_worker.keeper.gangstate import DOWN_TIMEOUT_SECONDS as DOWN_TIMEOUT_SECONDS
from fsdp_worker.keeper.gangstate import MAX_RECORDS as MAX_RECORDS

if TYPE_CHECKING:
    from fsdp_worker.keeper.gang import Keeper

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


class Coordinator(lineserver.LineServer):
    """Node rank 0's keeper serves the gang (`active`); every other keeper listens on standby
    for the operator's word when node rank 0 is lost: `promote` (a spare becomes node 0 and
    this coordinator) and `follow` (the others' keepers go to it). `keeper` hears both.
    Served by lineserver.LineServer's event loop; `handle_request_doc` may be called from any
    thread too (the state is a plain class under `lock`)."""

    def __init__(
        self,
        port: int,
        nodes: int = 0,
        *,
        active: bool = True,
        keeper: Keeper | None = None,
        creds: gangwire.Credentials | None = None,
    ) -> None:
        self.state = gangstate.State(nodes=nodes)
        self.active = active
        self.keeper = keeper
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.guard = guard.Guard(creds or gangwire.Credentials("", 0), clock=time.time)
        self._logged: dict[gangwire.Refusal, float] = {}  # reason -> when last logged
        super().__init__(port, slots=MAX_CONNECTIONS)

    async def answer_line(self, line: bytes, peer: str) -> dict[str, Any]:
        """One request line from `peer` (host:port): its answer in a signed envelope, or a
        refusal (counted, logged with the peer; nothing changed). A held request is awaited
        on the loop, not a thread."""
        nonce = ""
        try:
            request = self.guard.admit(line)
            nonce = request.nonce
            doc = request.model_dump(by_alias=True)
            answer, key = self._enter(doc, keeper_asks=isinstance(doc.get("from"), int))
            if key is not None:
                answer = await self._held_async(doc, key)
        except gangwire.Refused as exc:
            answer = self.refuse(exc, peer)
            nonce = _nonce_of(line)
        return gangwire.reply(answer, creds=self.guard.creds, nonce=nonce)

    def handle_line(self, line: bytes, peer: str) -> dict[str, Any]:
        """`answer_line` from a thread with no loop (tests, benchmarks)."""
        return asyncio.run(self.answer_line(line, peer))

    def refuse_busy(self, peer: str) -> None:
        self.refuse(gangwire.Refused(gangwire.Refusal.BUSY, "too many connections"), peer)

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
        """An authenticated request (its envelope checked: answer_line) as a dict: its effect
        and the gang's state after it, or a refusal of what the state does not allow (with the
        state). A keeper's `state`, `down` or `done` with `known` (the generation it knows) is
        held until there is news for it (State.waits, State.key) or HOLD_SECONDS pass;
        without `known`, answered at once. Blocks the calling thread while held."""
        answer, key = self._enter(doc, keeper_asks=False)
        if key is None:
            return answer
        with self.lock:
            return self._held(doc, key)

    def _enter(
        self, doc: dict[str, Any], *, keeper_asks: bool
    ) -> tuple[dict[str, Any], tuple[Any, ...] | None]:
        """`doc` heard: its answer, or (when it is to be held) the state's key it waits on a
        change of and no answer yet. A keeper's answer leaves out the operator's `quiet`."""
        with self.lock:
            st = self.state
            misplaced = st.out_of_place(doc)
            if misplaced is not None:
                st.refusals[misplaced.reason] += 1
                log.info("keeper port: refused %s", misplaced)
                state = st.answer(quiet=not keeper_asks)
                return {**state, "refused": str(misplaced), "reason": misplaced.reason}, None
            key = st.key()
            answer = self._handle(doc)
            if st.key() != key:
                self._notify()
            if self.active and doc.get("op") in HELD and doc.get("known") is not None:
                return {}, st.key()
            return answer if answer is not None else st.answer(quiet=not keeper_asks), None

    def _notify(self) -> None:
        """Every held request hears of a change: the threads waiting here and the loop's."""
        self.changed.notify_all()
        self.wake()

    def _held(self, doc: dict[str, Any], key: tuple[Any, ...]) -> dict[str, Any]:
        """A held request on the calling thread (under `lock`): its slim answer."""
        st = self.state
        deadline = time.monotonic() + HOLD_SECONDS
        while st.waits(doc) and st.key() == key and time.monotonic() < deadline:
            self.changed.wait(deadline - time.monotonic())
        return self._held_answer(doc)

    async def _held_async(self, doc: dict[str, Any], key: tuple[Any, ...]) -> dict[str, Any]:
        """A held request on the loop: awaited until the state's key changes or HOLD_SECONDS."""
        deadline = time.monotonic() + HOLD_SECONDS
        while True:
            with self.lock:
                st = self.state
                left = deadline - time.monotonic()
                if not st.waits(doc) or st.key() != key or left <= 0:
                    return self._held_answer(doc)
            await self.held(left)

    def _held_answer(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A held request's answer (under `lock`), for a keeper: without each node's `quiet`
        and with how many nodes are down in `doc`'s generation, not which (State.held_answer).
        Both are O(nodes), and `down` grew with every generation: a thousand keepers are
        answered at once after every change, and every keeper's watch every HOLD_SECONDS."""
        st = self.state
        sender = doc.get("from")
        if isinstance(sender, int) and 0 <= sender < st.nodes:
            st.heard[sender] = time.monotonic()
        return st.held_answer(doc.get("generation"))

    def _handle(self, doc: dict[str, Any]) -> dict[str, Any] | None:
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
        return None  # the state's answer

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


def _nonce_of(line: bytes) -> str:
    """A refused request's nonce, where it has one: the refusal answers it (an asker with
    this attempt's key can read why)."""
    with contextlib.suppress(ValueError):
        doc = json.loads(line)
        if isinstance(doc, dict) and isinstance(doc.get("nonce"), str):
            return str(doc["nonce"])[:64]
    return ""
