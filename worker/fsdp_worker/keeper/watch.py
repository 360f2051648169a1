"""A keeper's watch on the coordinator while its ranks run: a thread of held `state` requests
(long-poll, coordinator.HOLD_SECONDS), so that a new generation, a fence or a lost coordinator
reaches the keeper at once, with one request per hold instead of one every 0.2 s.

Apart from the keeper's loop (gang.py) because the loop must see its own ranks' exit at once
too: it waits on this watch's `news` and on its ranks, the watch on the coordinator. Asks
nothing but `state` and starts no process.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from fsdp_worker.contract.keeper import Op
from fsdp_worker.keeper import silence
from fsdp_worker.keeper.coordinator import HOLD_SECONDS

log = logging.getLogger("fsdp_worker.keeper.gang")

POLL_SECONDS = 0.2
"""How often a keeper asks the coordinator for the gang's generation while its ranks run."""
LOST_AFTER_SECONDS = 10.0
"""Asks that find no coordinator (refused, no route, the connection timed out) for this long:
it is gone (node 0's pod), not slow."""
SLOW_LOST_AFTER_SECONDS = 3 * LOST_AFTER_SECONDS
"""Unanswered asks for this long, though the coordinator accepted them: its process is there
but slow or frozen (silence.py). A frozen node rank 0 is the operator's to find, and its
`follow` ends the watch at once; a keeper's own "lost" gives up restarting in place (its ranks
killed, the gang recreated by the operator), so a coordinator that is merely slow, as on a
loaded machine at 1,024 nodes, is given three times as long."""
STANDBY_ASK_SECONDS = 0.5
"""A waiting spare's ask of node rank 0's coordinator: short, so that a `promote` (node 0
frozen: its asks hang to their timeout) is taken up at once."""
ASK_SECONDS = HOLD_SECONDS + 2.0
"""A held ask's timeout: the hold and the 2 s an answered ask had."""

Ask = Callable[..., dict[str, Any] | silence.NoAnswer]


class GenerationWatch:
    """Asks the coordinator, held, until generation `generation` ends for this node: `verdict`
    becomes "moved" (the gang moved on or stopped restarting), "lost" (once met, the
    coordinator could not be reached for `lost_after` seconds, or left asks it accepted
    unanswered for `slow_lost_after`: silence.Silence) or "fenced" (a spare holds this node),
    and `news` is set. `ask` returns the answer or silence.NoAnswer."""

    def __init__(
        self,
        *,
        generation: int,
        ask: Ask,
        fenced: Callable[[dict[str, Any]], bool],
        met: Callable[[], None],
        met_before: bool,
        poll: float,
        lost_after: float,
        slow_lost_after: float,
        who: str = "the coordinator",
    ) -> None:
        self.generation = generation
        self._ask, self._fenced, self._met = ask, fenced, met
        self.met = met_before
        self.poll = poll
        self.silence = silence.Silence(lost_after, slow_lost_after, who=who)
        self.verdict: str | None = None
        self.news = threading.Event()
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.is_set():
            asked = time.monotonic()
            doc = {"op": Op.STATE, "known": self.generation}
            answer = self._ask(doc, quiet=True, timeout=ASK_SECONDS)
            if self.stopped.is_set():
                return
            self.silence.hear(answer, asked=asked, now=time.monotonic())
            if not isinstance(answer, dict):
                # Before its first answer the coordinator is starting (node 0's pod may start
                # later, its name may not resolve yet): torchrun's rendezvous waits for it too.
                if self.met and self.silence.lost(time.monotonic()):
                    return self._end("lost")
                self.stopped.wait(self.poll)
                continue
            self.met = True
            self._met()
            verdict = self._judge(answer)
            if verdict is not None:
                return self._end(verdict)
            # a coordinator of an earlier release answers at once: poll it as before
            self.stopped.wait(max(0.0, self.poll - (time.monotonic() - asked)))

    def _judge(self, answer: dict[str, Any]) -> str | None:
        if self._fenced(answer):
            return "fenced"
        if answer.get("final") or int(answer.get("generation", 0)) > self.generation:
            return "moved"
        return None

    def _end(self, verdict: str) -> None:
        self.verdict = verdict
        self.news.set()


def on_exit(proc: subprocess.Popen[bytes], news: threading.Event) -> None:
    """Set `news` when `proc` exits, from a thread that waits for it: the keeper's loop sees
    its ranks' end at once rather than at its next look (up to POLL_SECONDS later, on the
    path of every restart: a failure is reported that much later)."""

    def wait() -> None:
        proc.wait()
        news.set()

    threading.Thread(target=wait, daemon=True).start()
