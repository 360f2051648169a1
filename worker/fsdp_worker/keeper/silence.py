"""When a keeper judges its coordinator lost: the rule, apart from the asks that feed it.

An ask that finds no coordinator at all (refused, no route, the connection timed out, a
stranger answers at its address) means node rank 0's process or pod is gone: judged lost after
`lost_after` seconds of that, as before. An ask whose connection was accepted and not answered
(contract.keeper.AnswerLate) means its process is there, slow or frozen: in issue 44,
bench/gang_scale.py's 1,024 keepers beside other work on two cores (load 40-150) met 10 s of
ask timeouts, judged the coordinator gone, and gave up a restart in place it would have done.
That is tolerated for `slow_lost_after` seconds of silence: a frozen node rank 0 is the
operator's to find (its hang or Lease rules), and its `follow` ends a keeper's watch at once,
so this verdict is only the fallback. Pure: times are given, nothing is asked here; the two
turns (slow, answering again) are logged once each.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Any

log = logging.getLogger("fsdp_worker.keeper.gang")


class NoAnswer(enum.StrEnum):
    """Why an ask of the coordinator went unanswered."""

    UNREACHABLE = "unreachable"  # no connection, or not this gang's coordinator: gone
    LATE = "late"  # connected, no answer in time: its process is there, slow or frozen


@dataclasses.dataclass
class Silence:
    """The coordinator's silence as one asker hears it: the asks since its last answer."""

    lost_after: float
    """Asks that found no coordinator, without a break, for this long: it is gone."""
    slow_lost_after: float
    """Unanswered asks of any kind for this long: it is gone, or as good as (frozen)."""
    who: str = "the coordinator"
    """What the log lines call it (its address)."""
    since: float | None = None
    """When the first unanswered ask of this silence was made; None while it answers."""
    unreachable_since: float | None = None
    """When the first of the unbroken run of asks that found no coordinator was made."""
    slow: bool = False
    """An ask of this silence was accepted and not answered (logged once)."""

    def hear(self, outcome: dict[str, Any] | NoAnswer, *, asked: float, now: float) -> None:
        """An ask made at `asked` ended at `now` with `outcome`: an answer or why none."""
        if isinstance(outcome, dict):
            if self.slow and self.since is not None:
                log.warning("%s answers again after %.1fs of silence", self.who, now - self.since)
            self.since, self.unreachable_since, self.slow = None, None, False
            return
        self.since = asked if self.since is None else self.since
        if outcome is NoAnswer.UNREACHABLE:
            if self.unreachable_since is None:
                self.unreachable_since = asked
            return
        self.unreachable_since = None
        if not self.slow:
            self.slow = True
            log.warning(
                "%s is slow: it accepted and did not answer in time (judged lost after %.0fs "
                "of silence, %.0fs if it cannot be reached)",
                self.who,
                self.slow_lost_after,
                self.lost_after,
            )

    def lost(self, now: float) -> bool:
        """Whether the coordinator is judged lost at `now`."""
        if self.since is None:
            return False
        gone = self.unreachable_since
        if gone is not None and now - gone >= self.lost_after:
            return True
        return now - self.since >= self.slow_lost_after
