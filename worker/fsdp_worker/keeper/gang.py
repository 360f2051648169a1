"""Restart a gang's ranks in place: the keeper in front of torchrun when
``failurePolicy.inPlaceRestarts`` is above 0.

Every pod of an attempt runs ``python -m fsdp_worker.keeper.gang <torchrun argv>``. The keeper
starts torchrun (generation 0) and stays beside it for the pod's life. When a rank fails, its
torchrun exits; its keeper reads the rank's termination message, tells the gang's coordinator (a
small TCP service the keeper of node rank 0 runs), and the coordinator moves the gang to the next
generation. Every keeper watches the coordinator: on a new generation it kills its torchrun's
whole process group at once (a survivor blocked in a collective goes down in a poll, not after
NCCL's timeout), reports it down, waits until every node is down, and starts its ranks again:
from its warm launcher (warm.py: forked from a process with torch imported) from generation 1
on, on every node alike. Rank 0's store is then new, every rank resumes (``auto``) from the
newest checkpoint sealed in this attempt (or the one the attempt started from), and no pod,
container or IP changes: no API-server round trip, no scheduling, no image start.

Why not torchrun's own elastic restarts (c10d rendezvous, ``--max-restarts``): measured here on
torch 2.15 with gloo, a restarted round reassigned node ranks (the operator reads rank 0's pod)
and its first round after a crash failed to connect gloo's mesh and needed a second. Why not the
kubelet's container restart rules: a node's container restarted alone joins the old store of a
rank 0 that has not yet noticed, and the kubelet's crash-loop backoff grows from the second
restart (docs/operator.md, "Restarts in place").

Escalation: a failure the keeper must not retry (a ConfigError, a non-retryable exit code, the
last in-place restart spent) ends its container with torchrun's exit code, leaving the rank's
termination message, and every other keeper stops its ranks and waits: the operator sees one
Failed pod and recreates the gang, as without this keeper. A keeper that loses the coordinator
(node 0's pod gone) also stops its ranks and waits for the operator: it recreates the gang, or,
with a warm spare (spec.spares), `promote`s the spare to node rank 0 (its keeper becomes the
coordinator, its ranks host the store) and tells every other keeper to `follow` it: they bring
what node 0's coordinator last told them (`rejoin`), and the gang restarts in place. Every
keeper therefore listens, on standby, on the coordinator's port.

The keeper imports no torch. The protocol is one JSON line each way per connection; like
torchrun's own store it is not authenticated and is reachable only where the job's pods reach
each other (the operator's NetworkPolicy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import json
import logging
import os
import posixpath
import secrets
import signal
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Annotated, Any

import pydantic
import pydantic.dataclasses

from fsdp_worker import contract
from fsdp_worker.contract import wire
from fsdp_worker.contract.keeper import Op, ask

log = logging.getLogger("fsdp_worker.keeper.gang")

POLL_SECONDS = 0.2
"""How often a keeper asks the coordinator for the gang's generation while its ranks run."""
LOST_AFTER_SECONDS = 10.0
"""Unanswered asks for this long: the coordinator is gone (node 0's pod), not slow."""
DOWN_TIMEOUT_SECONDS = 60.0
"""How long a keeper waits for every node to report its ranks down before it gives up the
restart and waits for the operator (a node whose keeper died never reports)."""
STANDBY_ASK_SECONDS = 0.5
"""A waiting spare's ask of node rank 0's coordinator: short, so that a `promote` (node 0
frozen: its asks hang to their timeout) is taken up at once."""
KILL_GRACE_SECONDS = 5.0
"""SIGTERM to torchrun on the pod's own SIGTERM: torchrun passes it to the ranks, which save."""
MAX_RECORDS = 8
"""Failures of earlier generations passed to the next one (rank 0 serves them)."""
WARM_AFTER_SECONDS = 10.0
"""A generation's own start (imports, rendezvous, load) has the CPU first; then the keeper
starts the warm launcher its next restart will use (warm.py). ``FSDP_WARM_LAUNCH`` in the
image's environment sets these seconds; 0 turns the warm launcher off."""


@pydantic.dataclasses.dataclass(frozen=True, config=wire.CAMEL)
class Gang:
    """FSDP_GANG: what the operator tells every keeper of an attempt."""

    restarts: Annotated[int, pydantic.Field(ge=0)]  # in-place restarts allowed in this attempt
    coordinator: str  # host:port of node rank 0's keeper
    node: int  # this pod's node rank
    nodes: int  # pods in the gang
    non_retryable: tuple[int, ...] = ()  # worker exit codes never retried in place
    spare: int | None = None  # a warm spare's number (spec.spares): it waits, node -1, for a node
    listen: int | None = None  # the port this keeper answers on (default: the coordinator's)

    @classmethod
    def from_env(cls, raw: str | None = None) -> Gang:
        """From the environment (or `raw`); ValueError names the field, the value and what is
        allowed."""
        raw = os.environ.get(contract.ENV_GANG, "") if raw is None else raw
        gang = wire.parse(cls, raw, what=contract.ENV_GANG)
        lowest = -1 if gang.spare is not None else 0  # a spare has no node yet
        if not lowest <= gang.node < gang.nodes:
            raise ValueError(
                f"{contract.ENV_GANG}: node={gang.node} must be {lowest} <= node < nodes "
                f"({gang.nodes})"
            )
        return gang

    def to_json(self) -> str:
        doc = wire.to_doc(self, drop_none={"spare", "listen"})  # set for spares and tests only
        return json.dumps(doc, separators=(",", ":"))

    @property
    def address(self) -> tuple[str, int]:
        return _host_port(self.coordinator)

    @property
    def listen_port(self) -> int:
        """Every keeper answers on this port: node rank 0's as the gang's coordinator, the
        others on standby, for the operator's word when node rank 0 is lost (`promote` to a
        spare, `follow` to the others). Pods listen on the coordinator's port, each on its
        own address; keepers sharing one host (tests) are given their own."""
        return self.listen if self.listen is not None else self.address[1]


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


# --- the coordinator (node rank 0's keeper) ----------------------------------------------------


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
            # seconds since each node's keeper last asked (every POLL_SECONDS while it keeps
            # its ranks or waits for the others): a frozen or stopped one falls silent, and
            # the operator does not wait for a restart in place it cannot take part in
            "quiet": {
                str(n): round(now - self.heard.get(n, self.started), 1) for n in range(self.nodes)
            },
        }

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
        entry = {**self.pending, "class": cls, "node": 0, "generation": ending,
                 "spare": self.holders[0]}  # fmt: skip
        first = next((f for f in self.failures if f.get("generation") == ending), None)
        if first is not None:
            entry["symptom"] = str(first.get("message") or first.get("class") or "")[:300]
            self.failures.remove(first)
        self.failures = [*self.failures, entry][-MAX_RECORDS:]
        self.down[ending] = set(range(self.nodes))
        self.generation = ending + 1
        self.gathering = None
        self.done.clear()


class Coordinator(socketserver.ThreadingTCPServer):
    """Node rank 0's keeper serves the gang (`active`); every other keeper listens on standby
    for the operator's word when node rank 0 is lost: `promote` (a spare becomes node 0 and
    this coordinator) and `follow` (the others' keepers go to it). `keeper` hears both."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, port: int, nodes: int = 0, *, active: bool = True, keeper: Keeper | None = None
    ) -> None:
        self.state = _State(nodes=nodes)
        self.active = active
        self.keeper = keeper
        self.lock = threading.Lock()
        super().__init__(("", port), _Handler)

    def handle_request_doc(self, doc: dict[str, Any]) -> dict[str, Any]:
        op = doc.get("op")
        with self.lock:
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
                st.down.setdefault(doc["generation"], set()).add(int(doc.get("node", -1)))
            elif op == Op.DONE and doc.get("generation", st.generation) == st.generation:
                st.done.add(int(doc.get("node", -1)))
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
            _host_port(str(master))
            if op == Op.FOLLOW:
                _host_port(str(coordinator))
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


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0

    def handle(self) -> None:
        try:
            doc = json.loads(self.rfile.readline(65536))
        except (ValueError, OSError):
            return
        if not isinstance(doc, dict):
            return
        assert isinstance(self.server, Coordinator)
        answer = self.server.handle_request_doc(doc)
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(answer).encode() + b"\n")


# --- the keeper -------------------------------------------------------------------------------


class Keeper:
    follow: tuple[str, str] | None = None  # the operator's `follow`: (coordinator, store)
    promoted: str | None = None  # the operator's `promote`: this spare is node 0, its store

    def __init__(self, gang: Gang, argv: Sequence[str]) -> None:
        self.gang = gang
        self.argv = list(argv)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.coordinator: Coordinator | None = None
        self.met = False  # the coordinator has answered once
        self.warm: subprocess.Popen[bytes] | None = None  # the next generation's launcher
        self._spawned_at = 0.0
        self.launched_warm = False  # this generation's ranks came from the warm launcher
        self.warm_deaths = 0
        self.warm_after = _seconds(os.environ.get(contract.ENV_WARM_LAUNCH), WARM_AFTER_SECONDS)
        self.warm_enabled = (
            self.warm_after > 0 and tuple(self.argv[1:3]) == contract.TORCHRUN_MODULE
        )
        self._oom_baseline = self._oom_kills()
        self.seen: dict[str, Any] = {}  # the coordinator's last answer
        # In the environment of every process this keeper launches, whoever its parent is now.
        self.token = secrets.token_hex(8)

    # The pod's SIGTERM (deletion, preemption, teardown) goes to torchrun, as without a keeper.
    def _on_term(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        self._drop_warm()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        self._listen()
        start = self._first_generation()
        if start is None:
            return 128 + signal.SIGTERM
        generation, failures = start
        while True:
            started = time.time()
            self.proc = self._spawn(generation, failures)
            outcome = self._watch(generation)
            code = self.proc.wait()
            if self.stopping:
                return code
            if self._warm_refused(outcome, code):
                continue  # the same generation, from torchrun
            outcome = self._settle(outcome, code, generation)
            if outcome == "done":
                return 0
            if outcome == "exited":  # this node's ranks failed first
                failure = self._failure(code, started)
                final = generation >= self.gang.restarts or not self._retryable(failure)
                self._report({"op": Op.FAIL, "generation": generation, "failure": failure,
                              "final": final})  # fmt: skip
                if final:
                    log.error("in-place restarts end here (%s): the operator takes over", failure)
                    self._drop_warm()
                    if self.coordinator is not None and self.coordinator.active:
                        time.sleep(2 * POLL_SECONDS)  # the others read `final` before it goes
                    return code
            nxt = self._next_generation(generation) if outcome != "lost" else None
            if nxt is None:
                why = f"generation {generation} is not restarted"
                nxt = self._wait_for_operator(why, generation)
            if nxt is None:
                return 128 + signal.SIGTERM
            generation, failures = nxt
            log.warning("restarting in place: generation %d after %s", generation, failures[-1:])

    def _first_generation(self) -> tuple[int, list[dict[str, Any]]] | None:
        """Generation 0, or a spare's: the one it is given a node's place in."""
        if self.gang.node >= 0:
            return 0, []
        start = self._stand_by()
        return (
            start
            if start is not None
            else self._wait_for_operator("the spare was not given a node")
        )

    def _settle(self, outcome: str, code: int, generation: int) -> str:
        """What torchrun's (or the warm launcher's) exit means for the gang: "done" (every
        node ended well), "moved" (a peer failed first: these ranks' failure is a symptom, or
        they ended well but a node failed after), "lost" (node rank 0 was lost: its successor
        says what next; or this node was given to a spare), else `outcome` as watched."""
        if self.follow is not None:
            return "lost"
        if outcome != "exited":
            return outcome
        moved = self._moved_on(generation)
        if moved is None:
            # A lost node's pod runs on (its kubelet stopped): its ranks end on their own when
            # the gang restarts without them, before its keeper's next ask saw it fenced. Its
            # ranks must not join the next generation beside the spare that holds the node.
            log.error("node %d was given to a spare: this keeper's ranks stop", self.gang.node)
            return "lost"
        if code == 0:
            if self._finished(generation):
                self._drop_warm()
                return "done"
            return "moved"  # a node failed after this one's ranks ended: again, with it
        return "moved" if moved else outcome

    def _finished(self, generation: int) -> bool:
        """Training ended well on this node: an exit barrier, as torchrun's agents keep one.
        True once every node's ranks ended well (node rank 0's keeper serves the coordinator
        until then), or node 0's is gone after they did; False when the gang moved on: a node
        failed after this one's ranks ended (its ranks' last save), and all start again."""
        done = {"op": Op.DONE, "node": self.gang.node, "generation": generation}
        log.info("generation %d's ranks ended well: waiting for every node's", generation)
        began = time.monotonic()
        deadline = began + DOWN_TIMEOUT_SECONDS
        silent_since: float | None = None
        while time.monotonic() < deadline and not self.stopping:
            # said again at each poll (the coordinator keeps a set): one report lost on a busy
            # node would hold both keepers here for DOWN_TIMEOUT_SECONDS after training ended,
            # their pods Running, for the operator to judge a hang
            answer = self._ask(done, quiet=True)
            if answer is None:
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since >= LOST_AFTER_SECONDS:
                    break  # node 0's keeper left: it leaves only once every node is done
            elif int(answer.get("generation", 0)) > generation and not answer.get("final"):
                log.warning("a node failed after these ranks ended: generation %d starts",
                            int(answer["generation"]))  # fmt: skip
                return False
            elif int(answer.get("done", 0)) >= self.gang.nodes:
                break
            else:
                silent_since = None
            time.sleep(POLL_SECONDS)
        log.info(
            "training ended on every node (%.1fs in the exit barrier)", time.monotonic() - began
        )
        return True

    def _next_generation(self, generation: int) -> tuple[int, list[dict[str, Any]]] | None:
        """Report this node's ranks down, wait for every node's, and read the generation to
        start; None when the gang stopped restarting in place or a node never came down."""
        answer = self._report({"op": Op.DOWN, "generation": generation, "node": self.gang.node})
        if answer is None or answer.get("final") or not self._all_down(generation):
            return None
        answer = self._ask({"op": Op.STATE})
        if answer is None or answer.get("final") or self._fenced(answer):
            return None
        return int(answer["generation"]), list(answer.get("failures", []))

    def _spawn(self, generation: int, failures: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
        """This generation's ranks: generation 0 from torchrun (the pod's command), every later
        one from the warm launcher (its ranks skip torchrun's and their own imports) unless
        warm launches are off, as on every node."""
        delta = {
            contract.ENV_GENERATION: str(generation),
            contract.ENV_RESTARTS_IN_PLACE: json.dumps(failures[-MAX_RECORDS:]),
        }
        if generation > 0:
            delta[contract.ENV_RESUME] = contract.RESUME_AUTO
            delta[contract.ENV_RESUME_RULES] = resume_rules(os.environ).to_json()
        self._spawned_at = time.monotonic()
        self.launched_warm = False
        if generation > 0:
            self._clear_termination_log()
        if generation > 0 and (launcher := self._go_warm(delta)) is not None:
            log.info("generation %d starts from the warm launcher (pid %d)", generation,
                     launcher.pid)  # fmt: skip
            self.launched_warm = True
            return launcher
        return subprocess.Popen(self.argv, env={**os.environ, **delta, KEEPER_TOKEN: self.token})

    def _warm_refused(self, outcome: str, code: int) -> bool:
        """The warm launcher could not run this argv the same way (its log says why): nor can
        any other node's (the same argv), so every node runs torchrun from now on."""
        if self.launched_warm and code == contract.WARM_NOT_LAUNCHED and outcome == "exited":
            log.warning("the warm launcher refused the launch: restarts run torchrun")
            self.warm_enabled = False
            return True
        return False

    def _go_warm(self, delta: dict[str, str]) -> subprocess.Popen[bytes] | None:
        """Every node runs the same launcher in a generation: torchrun in generation 0 (the
        pod's command), the warm launcher in every later one and at a spare's start, a new one
        where none is ready (cold: its imports happen now, still one fewer than torchrun's).
        The two cannot meet in one gang: torchrun's agents wait for node 0's agent, and a warm
        node 0 has none. None: warm launches are off (the same on every node)."""
        for _ in range(2):
            self._keep_warm(now=True)
            launcher, self.warm = self.warm, None
            if launcher is None or launcher.stdin is None:
                return None
            try:
                go = {"env": delta, "node": self.gang.node, "endpoint": rendezvous(self.argv)}
                launcher.stdin.write(json.dumps(go).encode() + b"\n")
                launcher.stdin.close()
                return launcher
            except OSError as exc:  # it died since (a kill, memory): a new one
                log.warning("the warm launcher is gone (%s): starting another", exc)
                self._drop_warm(launcher)
        return None

    def _keep_warm(self, *, now: bool = False) -> None:
        """Start the next generation's warm launcher once this one has had its start."""
        if not self.warm_enabled or self.stopping:
            return
        if self.warm is not None:
            if self.warm.poll() is None:
                return
            if self.warm.returncode == contract.WARM_NOT_LAUNCHED:  # it cannot run this argv
                log.warning("the warm launcher refused the launch: restarts run torchrun")
                self.warm, self.warm_enabled = None, False
                return
            self.warm = None  # it died unused (a kill, memory): a new one below, twice
            self.warm_deaths += 1
            if self.warm_deaths > 2:
                log.warning("the warm launcher keeps dying: restarts run torchrun")
                self.warm_enabled = False
                return
        if not now and time.monotonic() - self._spawned_at < self.warm_after:
            return
        argv = [self.argv[0], "-m", "fsdp_worker.keeper.warm", *self.argv[3:]]
        try:
            self.warm = subprocess.Popen(
                argv, stdin=subprocess.PIPE, env={**os.environ, KEEPER_TOKEN: self.token}
            )
        except OSError as exc:
            log.warning("no warm launcher (%s): restarts run torchrun", exc)
            self.warm_enabled = False

    def _drop_warm(self, launcher: subprocess.Popen[bytes] | None = None) -> None:
        """End a warm launcher that will not be used (closing its stdin ends it)."""
        launcher = launcher or self.warm
        if launcher is self.warm:
            self.warm = None
        if launcher is None or launcher.poll() is not None:
            return
        with contextlib.suppress(OSError, ValueError):
            if launcher.stdin is not None:
                launcher.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            launcher.kill()

    def _watch(self, generation: int) -> str:
        """Until torchrun exits ("exited"), the gang moves on ("moved"), the coordinator is
        lost or a spare was given this node ("lost"), or the pod is stopped ("stopping")."""
        assert self.proc is not None
        silent_since: float | None = None
        while self.proc.poll() is None:
            if self.stopping:
                return "stopping"
            time.sleep(POLL_SECONDS)
            self._keep_warm()
            answer = None if self.follow else self._ask({"op": Op.STATE}, quiet=True)
            if self.follow is not None:  # node rank 0 is lost: its successor restarts the gang
                self._kill()
                return "lost"
            if answer is None:
                # Before its first answer the coordinator is starting (node 0's pod may start
                # later, its name may not resolve yet): torchrun's rendezvous waits for it too.
                silent_since = silent_since or time.monotonic()
                if self.met and time.monotonic() - silent_since >= LOST_AFTER_SECONDS:
                    self._kill()
                    return "lost"
                continue
            silent_since, self.met = None, True
            if self._fenced(answer):
                log.error("node %d was given to a spare: this keeper's ranks stop", self.gang.node)
                self._kill()
                return "lost"
            if answer.get("final") or int(answer.get("generation", 0)) > generation:
                self._kill()
                return "moved"
        return "exited"

    def _fenced(self, answer: dict[str, Any]) -> bool:
        """A spare holds this keeper's node now: the operator found it lost (it may only have
        been cut off). Its ranks must not join again."""
        holder = (answer.get("holders") or {}).get(str(self.gang.node))
        return holder is not None and holder != self.gang.spare

    def _stand_by(self) -> tuple[int, list[dict[str, Any]]] | None:
        """A spare's wait: the image is started and the imports warmed (the page cache holds
        torch), until the coordinator names the node this spare now is, after the operator's
        `replace`. Returns the generation to start and the failures before it.

        Meanwhile the keeper answers rank 0's readiness probe itself (the spare carries it for
        when it becomes node rank 0): a spare standing by for hours is Ready, not counted by a
        platform's "pod not Ready" alert. Its ranks' metrics server takes the port after."""
        standby = _answer_progress(
            _port(os.environ.get(contract.ENV_METRICS_PORT), contract.DEFAULT_METRICS_PORT)
        )
        try:
            return self._stand_by_until_given()
        finally:
            if standby is not None:
                standby.shutdown()
                standby.server_close()

    def _stand_by_until_given(self) -> tuple[int, list[dict[str, Any]]] | None:
        if self.warm_enabled:
            self._keep_warm(now=True)  # its imports done before the takeover
        else:
            threading.Thread(target=_warm_imports, daemon=True).start()
        log.info("spare %s: standing by for a lost node", self.gang.spare)
        while not self.stopping:
            if self.promoted is not None:
                return self._become_node_zero(self.promoted)
            if self.follow is not None:  # node rank 0's coordinator and store, where now
                (coordinator, master), self.follow = self.follow, None
                self.gang = dataclasses.replace(self.gang, coordinator=coordinator)
                self.argv = with_endpoint(self.argv, master)
            answer = self._ask({"op": Op.STATE}, quiet=True, timeout=STANDBY_ASK_SECONDS) or {}
            holders = answer.get("holders") or {}
            node = next((int(n) for n, s in holders.items() if s == self.gang.spare), None)
            if node is None:
                time.sleep(POLL_SECONDS)
                continue
            self.gang = dataclasses.replace(self.gang, node=node)
            self.argv = with_node_rank(self.argv, node)
            self.met = True
            log.warning("spare %s takes node %d's place", self.gang.spare, node)
            if not self._all_down(int(answer["generation"]) - 1):
                return None
            answer = self._ask({"op": Op.STATE}) or {}
            if answer.get("final") or "generation" not in answer:
                return None
            return int(answer["generation"]), list(answer.get("failures", []))
        return None

    def _become_node_zero(self, master: str) -> tuple[int, list[dict[str, Any]]] | None:
        """The operator's `promote`: node rank 0 was lost and this spare takes its place, its
        ranks hosting the store at `master` and its keeper the gang's coordinator, which waits
        for the other nodes' keepers to rejoin. Returns the generation to start."""
        assert self.coordinator is not None
        self.gang = dataclasses.replace(
            self.gang, node=0, coordinator=f"127.0.0.1:{self.coordinator.server_address[1]}"
        )
        self.argv = with_endpoint(with_node_rank(self.argv, 0), master)
        self.met = True
        log.warning("spare %s takes node 0's place: the gang's coordinator, its store at %s",
                    self.gang.spare, master)  # fmt: skip
        return self._gathered()

    def _gathered(self) -> tuple[int, list[dict[str, Any]]] | None:
        """Wait while node rank 0's successor gathers the other nodes' keepers; the generation
        they all start, or None when one never came (the coordinator gave up: `final`)."""
        deadline = time.monotonic() + DOWN_TIMEOUT_SECONDS + LOST_AFTER_SECONDS
        while time.monotonic() < deadline and not self.stopping:
            answer = self._ask({"op": Op.STATE}, quiet=True)
            if answer is not None and answer.get("final"):
                return None
            if answer is not None and not answer.get("gathering") and "generation" in answer:
                return int(answer["generation"]), list(answer.get("failures", []))
            time.sleep(POLL_SECONDS / 2)
        return None

    def _rejoin(self, generation: int) -> tuple[int, list[dict[str, Any]]] | None:
        """The operator's `follow`: node rank 0 was lost and a spare took its place. Go to the
        new coordinator with what the old one last said, and start the generation it names."""
        assert self.follow is not None
        (coordinator, master), self.follow = self.follow, None
        self.gang = dataclasses.replace(self.gang, coordinator=coordinator)
        self.argv = with_endpoint(self.argv, master)
        seen, self.seen = self.seen, {}
        ran = max(generation, int(seen.get("generation", 0)))
        log.warning("node rank 0 was lost: node %d follows its successor's coordinator %s "
                    "(store %s) from generation %d", self.gang.node, coordinator, master,
                    ran)  # fmt: skip
        doc = {"op": Op.REJOIN, "node": self.gang.node, "generation": ran,
               "failures": seen.get("failures", []),
               "holders": seen.get("holders", {})}  # fmt: skip
        if self._ask(doc) is None:
            return None
        return self._gathered()

    def _moved_on(self, generation: int) -> bool | None:
        """Whether the gang moved past `generation`; None when a spare holds this node now."""
        answer = self._ask({"op": Op.STATE}, quiet=True)
        if answer is not None and self._fenced(answer):
            return None
        return answer is not None and int(answer.get("generation", 0)) > generation

    def _kill(self) -> None:
        """SIGKILL torchrun and every process it started, however they are parented now.
        torchrun starts each rank in a session of its own, so its process group alone would
        leave the ranks running (seen: an orphaned rank 0 kept its metrics port and stepped
        on); and a rank whose torchrun died first is no longer below it (reparented to the
        container's init), so it is found by the keeper's token in its environment. The next
        generation's warm launcher, not started yet, is spared."""
        assert self.proc is not None
        spared = {self.warm.pid, *descendants(self.warm.pid)} if self.warm is not None else set()
        kill_launched(self.token, roots=[self.proc.pid], spare=spared)

    def _all_down(self, generation: int) -> bool:
        """Wait for every node's keeper to report `generation`'s ranks down. This node's own
        report is said again at each poll (a set: one lost on a busy network costs nothing)."""
        report = {"op": Op.DOWN, "generation": generation, "node": self.gang.node}
        deadline = time.monotonic() + DOWN_TIMEOUT_SECONDS
        while time.monotonic() < deadline and not self.stopping and self.follow is None:
            answer = self._ask(report, quiet=True)
            down = (answer or {}).get("down", {}).get(str(generation), [])
            if len(down) >= self.gang.nodes:
                return True
            time.sleep(POLL_SECONDS / 2)
        return False

    def _report(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        """A report the gang must not miss (`fail`, `down`), asked again until the coordinator
        answers, for up to LOST_AFTER_SECONDS: one request that timed out on a busy node had
        the keeper give up restarting in place. Safe to repeat: the coordinator counts a
        generation's failure once and keeps the nodes down in a set."""
        deadline = time.monotonic() + LOST_AFTER_SECONDS
        answer = self._ask(doc)
        while answer is None and time.monotonic() < deadline and not self.stopping:
            time.sleep(POLL_SECONDS)
            answer = self._ask(doc, quiet=True)
        return answer

    def _ask(
        self, doc: dict[str, Any], *, quiet: bool = False, timeout: float = 2.0
    ) -> dict[str, Any] | None:
        try:
            answer = ask(self.gang.address, {**doc, "from": self.gang.node}, timeout=timeout)
        except (OSError, ValueError) as exc:
            if not quiet:
                log.warning("coordinator %s: %s", self.gang.coordinator, exc)
            return None
        if "generation" in answer and not answer.get("gathering"):
            self.seen = answer
        return answer

    def _listen(self) -> None:
        """Node rank 0's keeper serves the gang's coordinator; every other keeper listens on
        standby for the operator's `promote` or `follow` (node rank 0 lost). A standby that
        cannot listen costs only that: node 0's loss then recreates the gang."""
        node0 = self.gang.node == 0
        try:
            self.coordinator = Coordinator(self.gang.listen_port, self.gang.nodes, active=node0,
                                           keeper=self)  # fmt: skip
        except OSError as exc:
            if node0:
                raise
            log.warning("no standby listener on port %d (%s): a lost node rank 0 recreates "
                        "the gang", self.gang.listen_port, exc)  # fmt: skip
            return
        threading.Thread(target=self.coordinator.serve_forever, daemon=True).start()

    def _failure(self, code: int, started: float) -> dict[str, Any]:
        """This node's failure: its ranks' termination message, torchrun's exit code, and
        whether the kernel killed a process for memory since the generation started."""
        doc: dict[str, Any] = {}
        try:
            with open(_termination_log(), encoding="utf-8") as fh:
                text = fh.read(contract.TERMINATION_MESSAGE_MAX_BYTES)
            parsed = json.loads(text) if text.strip() else {}
            doc = parsed if isinstance(parsed, dict) else {}
        except (OSError, ValueError):
            pass
        keep = (*contract.TERMINATION_KEYS, "phase", "memory", contract.MEMORY_STEP_KEY)
        doc = {k: doc[k] for k in keep if k in doc}
        doc.update(node=self.gang.node, torchrunExitCode=code, time=round(time.time(), 3))
        doc["started"] = round(started, 3)
        if self._oom_kills() > self._oom_baseline:
            doc["reason"] = "OOMKilled"
        self._oom_baseline = self._oom_kills()
        return doc

    @staticmethod
    def _clear_termination_log() -> None:
        """Empty the file before a new generation: its ranks keep the first cause written
        there (termination.py), which must be theirs, not the last generation's."""
        with contextlib.suppress(OSError), open(_termination_log(), "w", encoding="utf-8"):
            pass

    @staticmethod
    def _oom_kills() -> int:
        """The container's cgroup count of kernel OOM kills (0 when not readable)."""
        try:
            with open("/sys/fs/cgroup/memory.events", encoding="utf-8") as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def _retryable(self, failure: dict[str, Any]) -> bool:
        if failure.get("class") == contract.FailureClass.CONFIG.value:
            return False
        code = failure.get("exitCode")
        permanent = {*self.gang.non_retryable, *contract.NON_RETRYABLE_EXIT_CODES}
        return not (isinstance(code, int) and code in permanent)

    def _wait_for_operator(
        self, why: str, generation: int | None = None
    ) -> tuple[int, list[dict[str, Any]]] | None:
        """Ranks stopped; the pod stays until the operator deletes it (SIGTERM ends this: None)
        or, where node rank 0 was lost, tells it to `follow` a spare that took node 0's place
        (the generation to start). The warm launcher is kept for that restart."""
        log.error("%s: waiting for the operator", why)
        if self.proc is not None and self.proc.poll() is None:
            self._kill()
            self.proc.wait()
        while not self.stopping:
            if self.follow is not None and generation is not None:
                nxt = self._rejoin(generation)
                if nxt is not None:
                    return nxt
                log.error("node rank 0's successor did not restart the gang: waiting for the "
                          "operator")  # fmt: skip
            time.sleep(POLL_SECONDS)
        self._drop_warm()
        return None


class _StandingBy(http.server.BaseHTTPRequestHandler):
    """contract.PROGRESS_PATH's answer while a spare stands by: 200, no ranks yet."""

    def do_GET(self) -> None:
        found = self.path.split("?", 1)[0] == contract.PROGRESS_PATH
        body = b"spare standing by: no ranks yet\n" if found else b"not found\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # a probe a few seconds is no news
        pass


def _answer_progress(port: int) -> http.server.ThreadingHTTPServer | None:
    """Serve _StandingBy on `port` from a daemon thread; None (logged) where it is taken,
    or where metrics are off (port 0, as for rank 0's server)."""
    if port <= 0:
        return None
    try:
        server = http.server.ThreadingHTTPServer(("", port), _StandingBy)
    except OSError as exc:
        log.warning("spare: cannot answer the readiness probe on port %d: %s", port, exc)
        return None
    # Polled often: a takeover waits for the shutdown before its ranks start.
    serve = functools.partial(server.serve_forever, poll_interval=0.05)
    threading.Thread(target=serve, name="standby-progress", daemon=True).start()
    return server


def _port(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a port: %d", contract.ENV_METRICS_PORT, raw, default)
        return default


WARM_IMPORTS = "import torch, torch.distributed.checkpoint, torch.distributed.fsdp"


def _warm_imports() -> None:
    """Import what a rank imports once, so that its files are in the page cache when the
    spare's torchrun starts (a cold torch import reads some hundred MB)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([sys.executable, "-c", WARM_IMPORTS], timeout=600, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def _seconds(raw: str | None, default: float) -> float:
    try:
        return max(0.0, float(raw)) if raw else default
    except ValueError:
        log.warning("%s=%r is not a number of seconds: %s", contract.ENV_WARM_LAUNCH, raw, default)
        return default


def with_node_rank(argv: Sequence[str], node: int) -> list[str]:
    """torchrun's argv with `--node-rank` set to `node` (a spare's template says 0)."""
    return _with_option(argv, ("--node-rank", "--node_rank"), str(node))


def with_endpoint(argv: Sequence[str], endpoint: str) -> list[str]:
    """torchrun's argv with `--rdzv-endpoint` (the static rendezvous' store) at `endpoint`."""
    return _with_option(argv, ("--rdzv-endpoint", "--rdzv_endpoint"), endpoint)


def rendezvous(argv: Sequence[str]) -> str:
    """torchrun's `--rdzv-endpoint` in `argv` ("" when it has none)."""
    names = ("--rdzv-endpoint", "--rdzv_endpoint")
    for i, arg in enumerate(argv):
        if arg.startswith(tuple(f"{n}=" for n in names)):
            return arg.split("=", 1)[1]
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
    return ""


def _with_option(argv: Sequence[str], names: tuple[str, ...], value: str) -> list[str]:
    """`argv` with torchrun's first option of `names` set to `value`: the launcher's own,
    not a same-named argument of the trainer after it."""
    out, done, skip = [], False, False
    for arg in argv:
        if skip:
            out.append(value)
            skip, done = False, True
        elif not done and arg.startswith(tuple(f"{n}=" for n in names)):
            out.append(f"{arg.split('=', 1)[0]}={value}")
            done = True
        else:
            skip = not done and arg in names
            out.append(arg)
    return out


KEEPER_TOKEN = "FSDP_KEEPER_TOKEN"  # noqa: S105 (the variable's name, not a secret)
"""Set by a keeper in the environment of everything it launches (torchrun, warm launchers),
and so of every rank, forked or exec'd: /proc/<pid>/environ keeps it whoever the parent is."""


def launched_by(token: str) -> list[int]:
    """The processes whose environment carries this keeper's token (a container has its own
    PID namespace: only its processes are visible, and the keeper's user reads their
    environ). Restricted pods cannot make a cgroup per rank; this finds the same set."""
    mark = f"{KEEPER_TOKEN}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if mark in env.split(b"\0"):
            found.append(int(entry))
    return found


def kill_launched(token: str, *, roots: Sequence[int], spare: set[int]) -> list[int]:
    """SIGKILL `roots`, everything below them and everything carrying `token`, but `spare`
    and this process; returns the pids signalled."""
    pids = {*roots, *(d for r in roots for d in descendants(r)), *launched_by(token)}
    doomed = sorted(pids - spare - {os.getpid()})
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return doomed


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (children first found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _termination_log() -> str:
    return os.environ.get(contract.ENV_TERMINATION_LOG) or contract.DEFAULT_TERMINATION_LOG


def resume_rules(env: dict[str, str] | os._Environ[str]) -> contract.ResumeRules:
    """What a restarted generation may resume from: this attempt's checkpoints, and earlier
    attempts' only up to the step this attempt started from (which must still be found)."""
    attempt = int(env.get(contract.ENV_ATTEMPT, "1"))
    resume = env.get(contract.ENV_RESUME, "")
    start: int | None = None
    if resume == contract.RESUME_AUTO and env.get(contract.ENV_RESUME_RULES):
        start = contract.ResumeRules.parse(env[contract.ENV_RESUME_RULES]).expect_step
    elif resume:
        name = posixpath.basename(resume.rstrip("/"))
        if name.startswith("step-") and name[5:].isdigit():
            start = int(name[5:])
    return contract.ResumeRules(attempt=attempt, resumed_from_step=start, expect_step=start)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m fsdp_worker.keeper.gang <torchrun argv...>", file=sys.stderr)
        return 2
    try:
        gang = Gang.from_env()
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return int(contract.ExitCode.CONFIG_ERROR)
    return Keeper(gang, args).run()


if __name__ == "__main__":
    sys.exit(main())
