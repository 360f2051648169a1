"""The keeper's wire: one JSON line asked, one JSON line answered, over TCP.

What the operator (run/keepers.py) and the keepers (keeper/gang.py) say to a gang's coordinator
goes through `ask`; the coordinator answers on the same connection. Stdlib only: the operator
imports this module.
"""

from __future__ import annotations

import enum
import json
import socket
from typing import Any


class Op(enum.StrEnum):
    """A request's `op`: what a keeper or the operator asks of a gang's coordinator, or tells
    a standby keeper. The values are the wire's: keepers of another release speak them too."""

    STATE = "state"
    """Anyone: the gang's generation, failures, nodes down and done, spares' places."""
    FAIL = "fail"
    """A keeper whose ranks failed first (`failure`, `final`: no restart in place after it);
    the operator's `final` alone when a takeover could not be completed."""
    DOWN = "down"
    """A keeper: its ranks of `generation` are stopped."""
    DONE = "done"
    """A keeper: its ranks of `generation` ended well (the exit barrier)."""
    REPLACE = "replace"
    """The operator: spare `spare` takes node `node`'s place (node lost or frozen)."""
    PROMOTE = "promote"
    """The operator, to a standby spare: node rank 0 is lost, become it and the coordinator."""
    FOLLOW = "follow"
    """The operator, to a standby keeper: the gang's coordinator and store are now elsewhere."""
    REJOIN = "rejoin"
    """A keeper told to follow: what node rank 0's coordinator last told it."""


def ask(address: tuple[str, int], doc: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request to the coordinator; OSError or ValueError when it does not answer."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(json.dumps(doc).encode() + b"\n")
        with sock.makefile("rb") as fh:
            answer = json.loads(fh.readline(1 << 20))
    if not isinstance(answer, dict):
        raise ValueError(f"coordinator answered {answer!r}")
    return answer
