"""What a keeper checks of a request before its coordinator hears it: the envelope.

A line is decoded and parsed as its op's model (contract/gangwire.py), then its mac, job,
attempt and time are checked against the attempt's credentials, and its nonce against the ones
seen lately (a replay). Anything that fails is `gangwire.Refused`; nothing here changes the
gang's state. What only the gang's state can judge (a node past the gang, a generation it is
not at) is the coordinator's (coordinator.py). Apart from it because it keeps its own memory
(the nonces) and has its own table of hostile cases (tests/unit/test_keeper_hostile.py).
"""

from __future__ import annotations

import collections
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
        self._seen: set[str] = set()  # the nonces of the last NONCE_MEMORY_SECONDS
        self._expiry: collections.deque[tuple[float, str]] = collections.deque()  # in ts order
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
        """Refused (a replay) if `nonce` was seen within NONCE_MEMORY_SECONDS; older ones are
        forgotten as new ones come, oldest first (O(1) a request: at 1,024 nodes asking 5
        times a second the keeper holds some 600,000)."""
        with self._lock:
            while self._expiry and self._expiry[0][0] <= now:
                self._seen.discard(self._expiry.popleft()[1])
            if nonce in self._seen:
                raise gangwire.Refused(gangwire.Refusal.REPLAY, f"nonce {nonce[:16]} seen")
            self._seen.add(nonce)
            self._expiry.append((now + NONCE_MEMORY_SECONDS, nonce))
