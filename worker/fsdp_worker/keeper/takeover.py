"""How a keeper takes a lost node's place: a warm spare standing by until the operator's
`replace` names its node, or its `promote` makes it node rank 0 and the gang's coordinator; and
how the other keepers `follow` (rejoin) node rank 0's successor. Apart from the keeper's
generation loop (gang.py), which calls in here when it has no node yet or is told to follow.
No torch is imported here.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from fsdp_worker.contract.keeper import Op
from fsdp_worker.keeper import standby, torchrun_argv
from fsdp_worker.keeper.coordinator import DOWN_TIMEOUT_SECONDS
from fsdp_worker.keeper.watch import LOST_AFTER_SECONDS, POLL_SECONDS, STANDBY_ASK_SECONDS

if TYPE_CHECKING:
    from fsdp_worker.keeper.gang import Keeper

log = logging.getLogger("fsdp_worker.keeper.gang")


def stand_by(k: Keeper) -> tuple[int, list[dict[str, Any]]] | None:
    """A spare's wait: the image is started and the imports warmed (the page cache holds
    torch), until the coordinator names the node this spare now is, after the operator's
    `replace`. Returns the generation to start and the failures before it. Meanwhile the
    keeper answers rank 0's readiness probe itself (standby.answering_probe)."""
    with standby.answering_probe():
        return _until_given(k)


def _until_given(k: Keeper) -> tuple[int, list[dict[str, Any]]] | None:
    if k.launchers.enabled:
        k._keep_warm(now=True)  # its imports done before the takeover
    else:
        threading.Thread(target=standby.warm_imports, daemon=True).start()
    log.info("spare %s: standing by for a lost node", k.gang.spare)
    while not k.stopping:
        if k.promoted is not None:
            return _become_node_zero(k, k.promoted)
        if k.follow is not None:  # node rank 0's coordinator and store, where now
            (coordinator, master), k.follow = k.follow, None
            k.gang = dataclasses.replace(k.gang, coordinator=coordinator)
            k.argv = torchrun_argv.with_endpoint(k.argv, master)
        answer = k._ask({"op": Op.STATE}, quiet=True, timeout=STANDBY_ASK_SECONDS) or {}
        holders = answer.get("holders") or {}
        node = next((int(n) for n, s in holders.items() if s == k.gang.spare), None)
        if node is None:
            time.sleep(POLL_SECONDS)
            continue
        k.gang = dataclasses.replace(k.gang, node=node)
        k.argv = torchrun_argv.with_node_rank(k.argv, node)
        k.met = True
        log.warning("spare %s takes node %d's place", k.gang.spare, node)
        if not k._all_down(int(answer["generation"]) - 1):
            return None
        answer = k._ask({"op": Op.STATE}) or {}
        if answer.get("final") or "generation" not in answer:
            return None
        return int(answer["generation"]), list(answer.get("failures", []))
    return None


def _become_node_zero(k: Keeper, master: str) -> tuple[int, list[dict[str, Any]]] | None:
    """The operator's `promote`: node rank 0 was lost and this spare takes its place, its
    ranks hosting the store at `master` and its keeper the gang's coordinator, which waits
    for the other nodes' keepers to rejoin. Returns the generation to start."""
    assert k.coordinator is not None
    k.gang = dataclasses.replace(
        k.gang, node=0, coordinator=f"127.0.0.1:{k.coordinator.server_address[1]}"
    )
    k.argv = torchrun_argv.with_endpoint(torchrun_argv.with_node_rank(k.argv, 0), master)
    k.met = True
    log.warning(
        "spare %s takes node 0's place: the gang's coordinator, its store at %s",
        k.gang.spare,
        master,
    )
    return gathered(k)


def gathered(k: Keeper) -> tuple[int, list[dict[str, Any]]] | None:
    """Wait while node rank 0's successor gathers the other nodes' keepers; the generation
    they all start, or None when one never came (the coordinator gave up: `final`)."""
    deadline = time.monotonic() + DOWN_TIMEOUT_SECONDS + LOST_AFTER_SECONDS
    while time.monotonic() < deadline and not k.stopping:
        answer = k._ask({"op": Op.STATE}, quiet=True)
        if answer is not None and answer.get("final"):
            return None
        if answer is not None and not answer.get("gathering") and "generation" in answer:
            return int(answer["generation"]), list(answer.get("failures", []))
        time.sleep(POLL_SECONDS / 2)
    return None


def rejoin(k: Keeper, generation: int) -> tuple[int, list[dict[str, Any]]] | None:
    """The operator's `follow`: node rank 0 was lost and a spare took its place. Go to the
    new coordinator with what the old one last said, and start the generation it names."""
    assert k.follow is not None
    (coordinator, master), k.follow = k.follow, None
    k.gang = dataclasses.replace(k.gang, coordinator=coordinator)
    k.argv = torchrun_argv.with_endpoint(k.argv, master)
    seen, k.seen = k.seen, {}
    ran = max(generation, int(seen.get("generation", 0)))
    log.warning(
        "node rank 0 was lost: node %d follows its successor's coordinator %s "
        "(store %s) from generation %d",
        k.gang.node,
        coordinator,
        master,
        ran,
    )
    doc = {
        "op": Op.REJOIN,
        "node": k.gang.node,
        "generation": ran,
        "failures": seen.get("failures", []),
        "holders": seen.get("holders", {}),
    }
    if k._ask(doc) is None:
        return None
    return gathered(k)
