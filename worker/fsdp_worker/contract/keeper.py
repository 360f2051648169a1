"""The keeper's wire: one JSON line asked, one JSON line answered, over TCP.

What the operator (reconcile.py) and the keepers (keeper/gang.py) say to a gang's coordinator
goes through `ask`; the coordinator answers on the same connection. Stdlib only: the operator
imports this module.
"""

from __future__ import annotations

import json
import socket
from typing import Any


def ask(address: tuple[str, int], doc: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request to the coordinator; OSError or ValueError when it does not answer."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(json.dumps(doc).encode() + b"\n")
        with sock.makefile("rb") as fh:
            answer = json.loads(fh.readline(1 << 20))
    if not isinstance(answer, dict):
        raise ValueError(f"coordinator answered {answer!r}")
    return answer
