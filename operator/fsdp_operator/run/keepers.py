"""What a pass asks a gang's keepers (fsdp_worker.contract.keeper) before it writes the status.

Two questions, each answered inside the pass because the answer changes what is written: in a
hang's grace, whether every keeper of an in-place gang is there (only then is its restart in
place waited for); and a spare's takeover of a lost node's place, which the keepers take or
refuse. Short timeouts: a silent keeper is an answer too, and a pass must not wait on it long.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from fsdp_operator.policy import decide
from fsdp_operator.types import names, observed
from fsdp_worker.contract import keeper

TAKEOVER_TIMEOUT = 2.0  # seconds for a keeper to answer a spare takeover's word
GANG_ASK_TIMEOUT = 1.0  # seconds for it to answer, in a hang's grace, whether it restarts


def gang_health(ip: str) -> observed.GangHealth:
    """Ask the in-place gang's coordinator whether its keepers are all there (a hang's grace
    waits for their restart in place only then)."""
    try:
        answer = keeper.ask(
            (ip, names.GANG_PORT), {"op": keeper.Op.STATE}, timeout=GANG_ASK_TIMEOUT
        )
    except (OSError, ValueError) as exc:
        return observed.GangHealth(answered=False, error=f"{ip}:{names.GANG_PORT}: {exc}")
    return observed.GangHealth.of(answer)


def take_over(t: decide.Takeover) -> str:
    """Tell the keepers that the spare takes the lost node's place: "" when they took it, else
    why not (the pass then writes the refusal, and the gang is recreated)."""
    return _promote(t) if t.node_rank == 0 else _replace(t)


def _tell(address: str, doc: dict[str, Any]) -> str:
    """One word to a keeper at host:port: "" when it took it, else why not."""
    host, _, port = address.rpartition(":")
    try:
        answer = keeper.ask((host, int(port)), doc, timeout=TAKEOVER_TIMEOUT)
    except (OSError, ValueError) as exc:
        return f"the keeper at {address} did not answer: {exc}"
    return str(answer.get("refused") or "")


def _replace(t: decide.Takeover) -> str:
    """A non-zero node rank's place: the spare is told where node rank 0's coordinator and
    store are now (its template names the attempt's first node 0, which a spare may have
    replaced since), then that coordinator gives it the place."""
    refused = _tell(
        t.spare_at, {"op": keeper.Op.FOLLOW, "coordinator": t.coordinator, "master": t.master}
    )
    if refused:
        return refused
    doc = {"op": keeper.Op.REPLACE, "node": t.node_rank, "spare": t.index, "failure": t.failure}
    return _tell(t.coordinator, doc)


def _promote(t: decide.Takeover) -> str:
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
    refused = _tell(t.coordinator, promote)
    if refused or not t.followers:
        return refused
    doc = {"op": keeper.Op.FOLLOW, "coordinator": t.coordinator, "master": t.master}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(t.followers))) as pool:
        answers = list(pool.map(lambda a: _tell(a, doc), t.followers))
    missed = [f"{a}: {why}" for a, why in zip(t.followers, answers, strict=True) if why]
    if not missed:
        return ""
    _tell(t.coordinator, {"op": keeper.Op.FAIL, "final": True})
    return f"{len(missed)} of {len(t.followers)} keepers did not follow: {missed[0]}"
