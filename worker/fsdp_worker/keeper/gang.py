"""The keeper: the process in front of torchrun on every pod of an attempt when
``failurePolicy.inPlaceRestarts`` is above 0 (``python -m fsdp_worker.keeper.gang <torchrun
argv>``, the operator's GANG_MODULE).

`Gang` is what the operator tells it (FSDP_GANG; contract/keeper.py, as the operator writes
it). `Keeper` runs this node's ranks generation
after generation: it watches the coordinator while they run, reports their failure, waits for
every node to come down and starts the next; a spare's keeper stands by until it is given a
node, or node rank 0's place. How restarts in place work, and why not torchrun's or the
kubelet's own, is the package's docstring (keeper/__init__.py). No torch is imported here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from fsdp_worker import contract
from fsdp_worker.contract import gangwire
from fsdp_worker.contract.keeper import AnswerLate, Op, ask
from fsdp_worker.contract.keeper import Gang as Gang  # FSDP_GANG, read here as gang.Gang
from fsdp_worker.keeper import launchers, ranks, silence, takeover, watch
from fsdp_worker.keeper.coordinator import DOWN_TIMEOUT_SECONDS, Coordinator
from fsdp_worker.keeper.silence import NoAnswer
from fsdp_worker.keeper.watch import LOST_AFTER_SECONDS, POLL_SECONDS, SLOW_LOST_AFTER_SECONDS

SYMPTOM_GRACE_SECONDS = 1.5
"""How long a node whose ranks failed only because a peer is gone waits for that peer's own
report before reporting its ranks' failure as the generation's cause."""

log = logging.getLogger("fsdp_worker.keeper.gang")


class Keeper:
    follow: tuple[str, str] | None = None  # the operator's `follow`: (coordinator, store)
    promoted: str | None = None  # the operator's `promote`: this spare is node 0, its store

    def __init__(
        self,
        gang: Gang,
        argv: Sequence[str],
        *,
        launch: launchers.Launchers | None = None,
        creds: gangwire.Credentials | None = None,
    ) -> None:
        """`launch` starts and kills the ranks (default: torchrun and the warm launcher, marked
        with this keeper's token); bench/gang_scale.py gives a stand-in, so that a thousand
        simulated nodes' keepers share one process. `creds`: what the gang's messages are
        signed with (default: the attempt's key file FSDP_GANG names)."""
        self.gang = gang
        # what every message to and from the gang is signed with (read once, at start)
        self.creds = creds if creds is not None else gang.credentials()
        self.argv = list(argv)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.coordinator: Coordinator | None = None
        self.met = False  # the coordinator has answered once
        self._oom_baseline = ranks.oom_kills()
        self.seen: dict[str, Any] = {}  # the coordinator's last answer
        # In the environment of every process this keeper launches, whoever its parent is now.
        self.token = secrets.token_hex(8)
        self.launchers = launch or launchers.Launchers(self.argv, token=self.token)

    # The pod's SIGTERM (deletion, preemption, teardown) goes to torchrun, as without a keeper.
    def _on_term(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        self.launchers.drop()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        return self.run_generations()

    def run_generations(self) -> int:
        """`run` without the SIGTERM handler (only a main thread may set one): the keeper's
        listener, then its ranks generation after generation; the exit code its pod ends with."""
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
            if self.launchers.refused(outcome, code):
                continue  # the same generation, from torchrun
            outcome = self._settle(outcome, code, generation)
            if outcome == "done":
                return 0
            failure = self._failure(code, started) if outcome == "exited" else {}
            if outcome == "exited" and self._a_peers_cause_follows(failure, generation):
                outcome = "moved"
            if outcome == "exited":  # this node's ranks failed first
                final = generation >= self.gang.restarts or not self._retryable(failure)
                self._report(
                    {"op": Op.FAIL, "generation": generation, "failure": failure, "final": final}
                )
                if final:
                    log.error("in-place restarts end here (%s): the operator takes over", failure)
                    self.launchers.drop()
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
                self.launchers.drop()
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
        heard = self._silence()
        while time.monotonic() < deadline and not self.stopping:
            # said again at each poll (the coordinator keeps a set): one report lost on a busy
            # node would hold both keepers here for DOWN_TIMEOUT_SECONDS after training ended,
            # their pods Running, for the operator to judge a hang
            asked = time.monotonic()
            answer = self._ask_held(done)
            heard.hear(answer, asked=asked, now=time.monotonic())
            if not isinstance(answer, dict):
                if heard.lost(time.monotonic()):
                    break  # node 0's keeper left: it leaves only once every node is done
            elif int(answer.get("generation", 0)) > generation and not answer.get("final"):
                log.warning(
                    "a node failed after these ranks ended: generation %d starts",
                    int(answer["generation"]),
                )
                return False
            elif int(answer.get("done", 0)) >= self.gang.nodes:
                break
            _pace(asked, POLL_SECONDS)
        log.info(
            "training ended on every node (%.1fs in the exit barrier)", time.monotonic() - began
        )
        return True

    def _next_generation(self, generation: int) -> tuple[int, list[dict[str, Any]]] | None:
        """Report this node's ranks down, wait for every node's, and read the generation to
        start; None when the gang stopped restarting in place or a node never came down."""
        # The report is the held ask itself (one exchange, not a report and then a wait: a
        # thousand keepers asking at once, each ask a chance to time out); the answer that
        # showed every node down names the generation to start, no `state` after it.
        answer = self._all_down_answer(generation)
        if answer is None or answer.get("final") or self._fenced(answer):
            return None
        return int(answer["generation"]), list(answer.get("failures", []))

    def _spawn(self, generation: int, failures: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
        """This generation's ranks (launchers.Launchers.start), told their generation and the
        failures before it; a restarted one's termination-message file emptied first."""
        delta = ranks.environment(generation, os.environ)
        if generation > 0:
            ranks.clear_termination_log()
        return self.launchers.start(
            self.argv, generation=generation, delta=delta, node=self.gang.node
        )

    def _keep_warm(self, *, now: bool = False) -> None:
        """The next generation's warm launcher, unless the pod is stopping."""
        if not self.stopping:
            self.launchers.keep(self.argv, now=now)

    def _watch(self, generation: int) -> str:
        """Until torchrun exits ("exited"), the gang moves on ("moved"), the coordinator is
        lost or a spare was given this node ("lost"), or the pod is stopped ("stopping"). The
        coordinator is watched by a thread of held asks (watch.GenerationWatch); this loop
        sees its news and the ranks' exit, each at once."""
        assert self.proc is not None
        seen = watch.GenerationWatch(
            generation=generation,
            ask=self._hear,
            fenced=self._fenced,
            met=self._meet,
            met_before=self.met,
            poll=POLL_SECONDS,
            lost_after=LOST_AFTER_SECONDS,
            slow_lost_after=SLOW_LOST_AFTER_SECONDS,
            who=f"coordinator {self.gang.coordinator}",
        )
        watch.on_exit(self.proc, seen.news)
        try:
            while self.proc.poll() is None:
                if self.stopping:
                    return "stopping"
                self._keep_warm()
                verdict = "lost" if self.follow is not None else seen.verdict
                if verdict is not None:
                    if verdict == "fenced":
                        log.error(
                            "node %d was given to a spare: this keeper's ranks stop",
                            self.gang.node,
                        )
                    self._kill()
                    return "moved" if verdict == "moved" else "lost"
                seen.news.wait(POLL_SECONDS)
            return "exited"
        finally:
            seen.stop()

    def _meet(self) -> None:
        self.met = True

    def _fenced(self, answer: dict[str, Any]) -> bool:
        """A spare holds this keeper's node now: the operator found it lost (it may only have
        been cut off). Its ranks must not join again."""
        holder = (answer.get("holders") or {}).get(str(self.gang.node))
        return holder is not None and holder != self.gang.spare

    def _stand_by(self) -> tuple[int, list[dict[str, Any]]] | None:
        return takeover.stand_by(self)

    def _rejoin(self, generation: int) -> tuple[int, list[dict[str, Any]]] | None:
        return takeover.rejoin(self, generation)

    def _a_peers_cause_follows(self, failure: dict[str, Any], generation: int) -> bool:
        """This node's ranks failed only because a peer is gone (a socket reset): the peer's
        own failure may be a moment behind on a loaded node (its launcher has yet to see its
        rank die; seen in CI: the survivor's words reported first and blamed). Wait up to
        SYMPTOM_GRACE_SECONDS for the gang to move on before this is reported as the cause."""
        said = contract.symptom_of(str(failure.get("message") or ""))
        if said is not contract.Symptom.PEER_GONE:
            return False
        deadline = time.monotonic() + SYMPTOM_GRACE_SECONDS
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(POLL_SECONDS)
            if self._moved_on(generation):
                log.info("a peer's failure was reported first: this node's ranks' is its symptom")
                return True
        return False

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
        generation's warm launcher, not started yet, is spared (launchers.Launchers.kill)."""
        assert self.proc is not None
        self.launchers.kill(self.proc)

    def _all_down(self, generation: int) -> bool:
        return self._all_down_answer(generation) is not None

    def _all_down_answer(self, generation: int) -> dict[str, Any] | None:
        """Report this node's ranks of `generation` down and wait for every node's: the
        answer that said so (or that the gang stopped restarting: `final`), or None. The
        report is said again at each poll (a set: one lost on a busy network costs nothing)."""
        report = {"op": Op.DOWN, "generation": generation, "node": self.gang.node}
        deadline = time.monotonic() + DOWN_TIMEOUT_SECONDS
        while time.monotonic() < deadline and not self.stopping and self.follow is None:
            asked = time.monotonic()
            answer = self._ask_held(report)
            if isinstance(answer, dict) and (
                answer.get("final") or self._down_in(answer, generation)
            ):
                return answer
            _pace(asked, POLL_SECONDS / 2)
        return None

    def _down_in(self, answer: dict[str, Any], generation: int) -> bool:
        """Whether `answer` says every node is down in `generation`: a held answer's count
        (the coordinator counts only the gang's members), else which nodes (every member)."""
        count = (answer.get("downs") or {}).get(str(generation))
        if isinstance(count, int):
            return count >= self.gang.nodes
        down = (answer.get("down") or {}).get(str(generation), [])
        return set(range(self.gang.nodes)) <= set(down)

    def _ask_held(self, doc: dict[str, Any]) -> dict[str, Any] | NoAnswer:
        """`doc` held by the coordinator until there is news for this keeper (the generation
        it last heard of moved on, or what `doc` waits for happened) or HOLD_SECONDS pass."""
        known = self.seen.get("generation")
        held = {**doc, "known": known} if isinstance(known, int) else doc
        return self._hear(held, quiet=True, timeout=watch.ASK_SECONDS)

    def _report(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        """A report the gang must not miss (`fail`; a `down` is said again by its own held
        wait, _all_down_answer), asked again until the coordinator answers or is judged lost
        (silence.Silence: LOST_AFTER_SECONDS where it cannot be reached, longer where it is
        slow): one request that timed out on a busy node had the keeper give up restarting in
        place. Safe to repeat: the coordinator counts a generation's failure once."""
        heard = self._silence()
        quiet = False
        while True:
            asked = time.monotonic()
            answer = self._hear(doc, quiet=quiet)
            heard.hear(answer, asked=asked, now=time.monotonic())
            if isinstance(answer, dict):
                return answer
            if heard.lost(time.monotonic()) or self.stopping or self.follow is not None:
                # `follow`: node rank 0 was frozen or lost and a spare took its place; this
                # report is for a coordinator that may never answer, and the new one is
                # waiting for this keeper (seen in the goodput soak: a report to a frozen
                # coordinator held a keeper from its successor past the operator's patience)
                return None
            time.sleep(POLL_SECONDS)
            quiet = True

    def _silence(self) -> silence.Silence:
        """A fresh count of the coordinator's silence, with the keeper's limits."""
        return silence.Silence(
            LOST_AFTER_SECONDS, SLOW_LOST_AFTER_SECONDS, who=f"coordinator {self.gang.coordinator}"
        )

    def _ask(
        self, doc: dict[str, Any], *, quiet: bool = False, timeout: float = 2.0
    ) -> dict[str, Any] | None:
        """`doc` asked of the coordinator: its answer, or None (_hear says why)."""
        answer = self._hear(doc, quiet=quiet, timeout=timeout)
        return answer if isinstance(answer, dict) else None

    def _hear(
        self, doc: dict[str, Any], *, quiet: bool = False, timeout: float = 2.0
    ) -> dict[str, Any] | NoAnswer:
        """`doc` asked of the coordinator: its answer, or why there was none (slow, or gone:
        not reached at all, or a stranger answered at its address)."""
        try:
            answer = ask(
                self.gang.address,
                {**doc, "from": self.gang.node},
                creds=self.creds,
                timeout=timeout,
            )
        except (OSError, ValueError) as exc:
            if not quiet:
                log.warning("coordinator %s: %s", self.gang.coordinator, exc)
            return NoAnswer.LATE if isinstance(exc, AnswerLate) else NoAnswer.UNREACHABLE
        if "generation" in answer and not answer.get("gathering"):
            self.seen = answer
        return answer

    def _listen(self) -> None:
        """Node rank 0's keeper serves the gang's coordinator; every other keeper listens on
        standby for the operator's `promote` or `follow` (node rank 0 lost). A standby that
        cannot listen costs only that: node 0's loss then recreates the gang."""
        node0 = self.gang.node == 0
        try:
            self.coordinator = Coordinator(
                self.gang.listen_port,
                self.gang.nodes,
                active=node0,
                keeper=self,
                creds=self.creds,
            )
        except OSError as exc:
            if node0:
                raise
            log.warning(
                "no standby listener on port %d (%s): a lost node rank 0 recreates " "the gang",
                self.gang.listen_port,
                exc,
            )
            return
        threading.Thread(target=self.coordinator.serve_forever, daemon=True).start()

    def _failure(self, code: int, started: float) -> dict[str, Any]:
        """This node's failure (ranks.failure), an OOM kill counted since the last one."""
        kills = ranks.oom_kills()
        killed = kills > self._oom_baseline
        failure = ranks.failure(node=self.gang.node, code=code, started=started, oom_killed=killed)
        self._oom_baseline = kills
        return failure

    def _retryable(self, failure: dict[str, Any]) -> bool:
        return ranks.retryable(failure, non_retryable=self.gang.non_retryable)

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
                log.error(
                    "node rank 0's successor did not restart the gang: waiting for the " "operator"
                )
            time.sleep(POLL_SECONDS)
        self.launchers.drop()
        return None


def _pace(asked: float, every: float) -> None:
    """Sleep what is left of `every` since `asked`: a held ask has waited already; a
    coordinator of an earlier release answers at once and is polled as before."""
    time.sleep(max(0.0, every - (time.monotonic() - asked)))


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m fsdp_worker.keeper.gang <torchrun argv...>", file=sys.stderr)
        return 2
    try:
        gang = Gang.from_env()
        creds = gang.credentials()
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return int(contract.ExitCode.CONFIG_ERROR)
    if creds.key is None:
        log.warning("no key file in %s: the gang's messages are not signed", contract.ENV_GANG)
    return Keeper(gang, args, creds=creds).run()


if __name__ == "__main__":
    sys.exit(main())
