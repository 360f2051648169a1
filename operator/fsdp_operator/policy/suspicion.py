"""Nodes suspected, not lost: a kubelet stopped renewing its Lease under the job while the
gang trains on, or before its first step while the node's keeper still speaks (detect declares
a node lost only when the job stops stepping or the keeper falls silent, or NotReady or the
Lease's silence passes nodeLossGraceSeconds), so a kubelet paused or restarting costs the job
nothing. A user still wants to know the node is sick: each suspect is kept in
status.suspectNodes and said once in a NodeSuspect Warning Event; NodeSuspectCleared says when
it renews again or no longer holds the job's pods. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

from fsdp_operator.policy import deadlines, decision
from fsdp_operator.types import observed

SUSPECT_LIMIT = 64  # nodes status.suspectNodes keeps (the CRD's maxItems)


def judge(d: decision.Draft, obs: observed.Observed) -> None:
    """Name the attempt's running pods' nodes whose Lease is silent; clear those that renew.
    Called only for an attempt that runs on with no failure found this pass."""
    s = d.status
    now = _silent(obs, s.attempt)[:SUSPECT_LIMIT]  # a node not kept would be said every pass
    for node in now:
        if node not in s.suspect_nodes:
            d.emit("NodeSuspect", _suspect_words(obs, node), warning=True)
    for node in s.suspect_nodes:
        if node not in now:
            d.emit("NodeSuspectCleared", _cleared_words(obs, node))
    s.suspect_nodes = now


def forget(d: decision.Draft) -> None:
    """The attempt ends (a failure found, the job finished, suspended or stopped, a new
    attempt): its suspects go with it, unsaid (a node declared lost is said by the failure's
    own Events)."""
    d.status.suspect_nodes = []


def _silent(obs: observed.Observed, attempt: int) -> list[str]:
    """The nodes of the attempt's running pods whose kubelet no longer renews its Lease."""
    found = {
        p.node
        for p in obs.attempt_pods(attempt)
        if p.node
        and p.phase is observed.PodPhase.RUNNING
        and (n := obs.node(p.node)) is not None
        and n.lease_silent_seconds is not None
    }
    return sorted(found)


def _suspect_words(obs: observed.Observed, node: str) -> str:
    view = obs.node(node)
    silent = view.lease_silent_seconds if view is not None else None
    grace = obs.spec.failure_policy.node_loss_grace_seconds
    if deadlines.keepers_vouch(obs):  # judged by its keeper (detect)
        return (
            f"node {node} stopped renewing its Lease ({silent or 0:.0f}s) before the attempt's "
            "first step, and its pod's keeper still asks the gang's coordinator: its kubelet is "
            "paused or restarting, so the node is not lost. It is declared lost if its keeper "
            f"falls silent, or once it is NotReady for nodeLossGraceSeconds ({grace}s)"
        )
    return (
        f"node {node} stopped renewing its Lease ({silent or 0:.0f}s) while the job trains on "
        f"(step {obs.status.step if obs.status.step is not None else '?'}): its kubelet is "
        "paused or restarting, so the node is not lost. It is declared lost if the job stops "
        f"stepping, or once it is NotReady for nodeLossGraceSeconds ({grace}s)"
    )


def _cleared_words(obs: observed.Observed, node: str) -> str:
    view = obs.node(node)
    if view is not None and view.lease_silent_seconds is None:
        return f"node {node} renews its Lease again: not lost"
    return f"node {node} no longer runs this attempt's pods"
