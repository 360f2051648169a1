"""What a keeper checks of a request before its coordinator hears it: the envelope.

A line is decoded and parsed as its op's model (contract/gangwire.py), then its mac, job,
attempt and time are checked against the attempt's credentials, and its nonce against the ones
seen lately (a replay). Anything that fails is `gangwire.Refused`; nothing here changes the
gang's state. What only the gang's state can judge (a node past the gang, a generation it is
not at) is the coordinator's (coordinator.py). Apart from it because it keeps its own memory
(the nonces) and has its own table of hostile cases (tests/unit/test_keeper_hostile.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fsdp_worker.contract import gangwire

NONCE_MEMORY_SECONDS = 2 * gangwire.SKEW_SECONDS
"""A nonce is remembered this long: a request whose `ts` still passes cannot be replayed."""


class Guard:
    """The envelope checks of one keeper (any thread)."""

    def __init__(self, creds: gangwire.Credentials, *, clock: Callable[[], float]) -> None:
        self.creds = creds
        self._clock = clock
        self._seen: dict[str, float] = {}  # nonce -> when it is forgotten
        self._pruned = 0.0
        self._lock = threading.Lock()

    def admit(self, line: bytes) -> gangwire.Request:
        """`line` as a request of this gang, seen for the first time; Refused otherwise."""
        doc = gangwire.decode(line)
        request = gangwire.parse_request(doc)
        now = self._clock()
        gangwire.check_envelope(doc, self.creds, now=now)
        self._remember(request.nonce, now)
        return request

    def _remember(self, nonce: str, now: float) -> None:
        """Refused (a replay) if `nonce` was seen within NONCE_MEMORY_SECONDS; the ones older
        are forgotten as new ones come (one pass over the map a second at most)."""
        with self._lock:
            if self._seen.get(nonce, 0.0) > now:
                raise gangwire.Refused(gangwire.Refusal.REPLAY, f"nonce {nonce[:16]} seen")
            if now - self._pruned > 1.0:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
                self._pruned = now
            self._seen[nonce] = now + NONCE_MEMORY_SECONDS
