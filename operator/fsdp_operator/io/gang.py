"""The operator's one client of the gangs' keepers (port 29501, restarts in place).

What a pass asks a gang (run/keepers.py decides what) goes through `GangClient.ask`: signed
with the attempt's key, derived here from the operator's master key (io/gangkey.py keeps it),
and obeyed only when the answer is signed by the same attempt's key (a reused pod IP answers as
a stranger). The keys of attempts go to their pods in a Secret (run/objects.py creates it from
`attempt_key`). No decisions here; the transport is fsdp_worker.contract.keeper's `ask`.
"""

from __future__ import annotations

from typing import Any

from fsdp_worker.contract import gangwire, keeper


class GangClient:
    """Asks keepers as the operator (any thread: it keeps only the master key)."""

    def __init__(self, master: bytes | None) -> None:
        """`master`: the operator's master key; None signs nothing (unit tests, and gangs of
        keepers started without a key file)."""
        self._master = master

    def attempt_key(self, job_uid: str, attempt: int) -> bytes | None:
        """The key of one attempt's gang (its pods' Secret), None without a master key."""
        if self._master is None:
            return None
        return gangwire.attempt_key(self._master, job_uid, attempt)

    def credentials(self, job_uid: str, attempt: int) -> gangwire.Credentials:
        return gangwire.Credentials(job_uid, attempt, self.attempt_key(job_uid, attempt))

    def ask(
        self, address: str, doc: dict[str, Any], *, job_uid: str, attempt: int, timeout: float
    ) -> dict[str, Any]:
        """`doc` (`op` and its fields) to the keeper at host:port, as the operator of that
        job's attempt; its verified answer. OSError or ValueError when there is none."""
        creds = self.credentials(job_uid, attempt)
        return keeper.ask(keeper.host_port(address), doc, creds=creds, timeout=timeout)
