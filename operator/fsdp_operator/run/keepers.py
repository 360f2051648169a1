"""What a pass asks a gang's keepers (through io/gang.py's client) before it writes the status.

Two questions, each answered inside the pass because the answer changes what is written: in a
hang's grace, whether every keeper of an in-place gang is there (only then is its restart in
place waited for); and a spare's takeover of a lost node's place, which the keepers take or
refuse. Short timeouts: a silent keeper is an answer too, and a pass must not wait on it long.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Any

from fsdp_operator.io import gang
from fsdp_operator.policy import decide
from fsdp_operator.types import names, observed
from fsdp_worker.contract import keeper

TAKEOVER_TIMEOUT = 2.0  # seconds for a keeper to answer a spare takeover's word
GANG_ASK_TIMEOUT = 1.0  # seconds for it to answer, in a hang's grace, whether it restarts


@dataclasses.dataclass(frozen=True)
class Asker:
    """The gang client, speaking for one attempt of one job."""

    client: gang.GangClient
    job_uid: str
    attempt: int

    def ask(self, address: str, doc: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        return self.client.ask(
            address, doc, job_uid=self.job_uid, attempt=self.attempt, timeout=timeout
        )


class Lateness:
    """When each gang coordinator began to accept the operator's asks without answering, in a
    run of such asks (policy/frozen.py: node rank 0's pod frozen whole); forgotten at its next
    answer or any other outcome. Any thread."""

    FORGET_SECONDS = 3600.0  # a run this old is a job gone long ago: dropped at the next note

    def __init__(self) -> None:
        self._since: dict[tuple[str, int, str], float] = {}
        self._lock = threading.Lock()

    def note(self, key: tuple[str, int, str], *, late: bool, now: float) -> float | None:
        """Seconds `key`'s coordinator has been late, counting this ask (0 at the first);
        None when this ask was not late."""
        with self._lock:
            if not late:
                self._since.pop(key, None)
                return None
            stale = [k for k, t in self._since.items() if now - t > self.FORGET_SECONDS]
            for k in stale:
                del self._since[k]
            return now - self._since.setdefault(key, now)


def gang_health(
    asker: Asker, ip: str, *, lateness: Lateness | None = None, now: float = 0.0
) -> observed.GangHealth:
    """Ask the in-place gang's coordinator whether its keepers are all there (a hang's grace
    waits for their restart in place only then), and which fell silent; with `lateness`, for
    how long in a row it has accepted asks without answering."""
    key = (asker.job_uid, asker.attempt, ip)
    try:
        answer = asker.ask(
            f"{ip}:{names.GANG_PORT}", {"op": keeper.Op.STATE}, timeout=GANG_ASK_TIMEOUT
        )
    except (OSError, ValueError) as exc:
        late = isinstance(exc, keeper.AnswerLate)
        seconds = lateness.note(key, late=late, now=now) if lateness is not None else None
        return observed.GangHealth(
            answered=False, error=f"{ip}:{names.GANG_PORT}: {exc}", late_seconds=seconds
        )
    if lateness is not None:
        lateness.note(key, late=False, now=now)
    return observed.GangHealth.of(answer)


def take_over(asker: Asker, t: decide.Takeover) -> str:
    """Tell the keepers that the spare takes the lost node's place: "" when they took it, else
    why not (the pass then writes the refusal, and the gang is recreated)."""
    return _promote(asker, t) if t.node_rank == 0 else _replace(asker, t)


def _tell(asker: Asker, address: str, doc: dict[str, Any]) -> str:
    """One word to a keeper at host:port: "" when it took it, else why not."""
    try:
        answer = asker.ask(address, doc, timeout=TAKEOVER_TIMEOUT)
    except (OSError, ValueError) as exc:
        return f"the keeper at {address} did not answer: {exc}"
    return str(answer.get("refused") or "")


def _replace(asker: Asker, t: decide.Takeover) -> str:
    """A non-zero node rank's place: the spare is told where node rank 0's coordinator and
    store are now (its template names the attempt's first node 0, which a spare may have
    replaced since), then that coordinator gives it the place."""
    refused = _tell(
        asker,
        t.spare_at,
        {"op": keeper.Op.FOLLOW, "coordinator": t.coordinator, "master": t.master},
    )
    if refused:
        return refused
    doc = {"op": keeper.Op.REPLACE, "node": t.node_rank, "spare": t.index, "failure": t.failure}
    return _tell(asker, t.coordinator, doc)


def _promote(asker: Asker, t: decide.Takeover) -> str:
    """Node rank 0's place: the spare's keeper becomes the gang's coordinator, its ranks host
    the store, and every other node's keeper is told to follow it (side by side: at scale one
    after another would add a timeout per silent pod). A keeper that did not take it leaves
    the promoted coordinator waiting for it: it is told to give up (`final`), and the gang is
    recreated."""
    promote = {
        "op": keeper.Op.PROMOTE,
        "master": t.master,
        "failure": t.failure,
        "generation": t.generation,
    }
    refused = _tell(asker, t.coordinator, promote)
    if refused or not t.followers:
        return refused
    doc = {"op": keeper.Op.FOLLOW, "coordinator": t.coordinator, "master": t.master}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(t.followers))) as pool:
        answers = list(pool.map(lambda a: _tell(asker, a, doc), t.followers))
    missed = [f"{a}: {why}" for a, why in zip(t.followers, answers, strict=True) if why]
    if not missed:
        return ""
    _tell(asker, t.coordinator, {"op": keeper.Op.FAIL, "final": True})
    return f"{len(missed)} of {len(t.followers)} keepers did not follow: {missed[0]}"
