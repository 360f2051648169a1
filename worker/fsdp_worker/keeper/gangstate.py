"""The gang's state, as node rank 0's coordinator keeps it: the generation the ranks run, who
failed first, which nodes are down or done, which spare holds a node, and what a held request
waits for. A plain class: the coordinator (coordinator.py) calls it under its lock, from its
event loop's thread and from the keeper's; it reads no socket, starts nothing and asks nothing.
Its truth tables are tests/unit/test_gang_coordinator.py's and the hostile table's.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from fsdp_worker import contract
from fsdp_worker.contract import gangwire
from fsdp_worker.contract.keeper import MAX_SPARE, Op

DOWN_TIMEOUT_SECONDS = 60.0
"""How long a keeper waits for every node to report its ranks down before it gives up the
restart and waits for the operator (a node whose keeper died never reports); a promoted spare's
coordinator waits as long for the other nodes to rejoin."""
MAX_RECORDS = 8
"""Failures of earlier generations passed to the next one (rank 0 serves them)."""


@dataclasses.dataclass
class State:
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

    def answer(self, *, quiet: bool = True, only: object = None) -> dict[str, Any]:
        """The gang's state as a reply. `quiet` (each node's silence, the operator's) is left
        out of a keeper's, and a held request's `down` is only its `only` generation's: both
        are O(nodes), built for every keeper after every change at 1,024 nodes."""
        now = time.monotonic()
        if self.gathering is not None and now - self.gathering > DOWN_TIMEOUT_SECONDS:
            self.gathering, self.final = None, True  # a node never rejoined: the operator's
        answer = {
            "generation": self.generation,
            "gathering": self.gathering is not None,
            "final": self.final,
            "failures": self.failures[-MAX_RECORDS:],
            "down": self._down(only),
            "done": len(self.done),
            "holders": {str(n): spare for n, spare in self.holders.items()},
            "refusals": dict(self.refusals),  # requests refused, by gangwire.Refusal
        }
        if quiet:
            # seconds since each node's keeper last asked or was answered (at least every
            # HOLD_SECONDS while it keeps its ranks or waits for the others): a frozen or
            # stopped one falls silent, and the operator does not wait for a restart in
            # place it cannot take part in
            answer["quiet"] = {
                str(n): round(now - self.heard.get(n, self.started), 1) for n in range(self.nodes)
            }
        return answer

    def held_answer(self, generation: object) -> dict[str, Any]:
        """A held request's answer, for a keeper (coordinator.py): how many nodes are down in
        `generation` (`downs`), not which (a list of a thousand, to each of a thousand keepers
        at once after the last one's report). Only the gang's members are ever counted:
        out_of_place refuses any other node."""
        answer = self.answer(quiet=False, only=-1)
        nodes = self.down.get(generation) if isinstance(generation, int) else None
        answer["downs"] = {str(generation): len(nodes)} if nodes is not None else {}
        return answer

    def _down(self, only: object) -> dict[str, list[int]]:
        if only is None:
            return {str(g): sorted(n) for g, n in self.down.items()}
        nodes = self.down.get(only) if isinstance(only, int) else None
        return {str(only): sorted(nodes)} if nodes is not None else {}

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
