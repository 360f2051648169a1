"""A pod frozen whole, suspected in seconds rather than after the progress deadline, where a warm
spare can take its place (issue 48: the gang sees its own failures).

Every node's keeper asks the gang's coordinator at least every coordinator.HOLD_SECONDS (its
held ask), so one silent for observed.GANG_SILENT_SECONDS (about two of those) while the gang
has made no step for as long is a suspect: its pod stopped (SIGSTOP, a cgroup freeze, a hung
container runtime), or its node went. The two are told apart by the node's own Lease: a node
that renewed it a whole renew period after the keeper fell silent is alive, so its pod is
frozen; a lost node renews nothing after, and is the Lease path's (detect._node_lost: NodeLost,
the node excluded). Acted on early only where acting is cheap and safe (a restart in place with
the suspect fenced: spares.take_over gives its node rank to a running spare); otherwise the
progress deadline judges as before.

The coordinator itself (node rank 0's keeper) cannot report its own silence: its pod is the
suspect when it accepts the operator's asks (its kernel does, the process is there) and answers
none for COORDINATOR_LATE_SECONDS while its node renews its Lease (run/keepers.Lateness keeps
how long). One that refuses or cannot be reached is a crash or a lost node, not this rule's.

Never a suspect: a gang that steps (a keeper silent under a training gang costs nothing yet), a
slow save or step (the keepers keep asking: silence, not slowness, is the evidence), several
keepers silent at once (a partition, the coordinator's own trouble), a node whose Lease the
operator cannot read (the watch stalled, off) or that missed a renewal, and any keeper while a
spare promoted to node rank 0 gathers the others (they come to it as the operator's `follow`
reaches them, each after stopping its ranks: a false suspect there, seen in the goodput soak,
handed a healthy node to a second spare mid-takeover and the gang was recreated). Pure: no
I/O, no clock.
"""

from __future__ import annotations

from fsdp_operator.policy import decision
from fsdp_operator.types import observed

SUSPECT_SECONDS = observed.GANG_SILENT_SECONDS
"""No step seen for this long: the pass asks the gang's coordinator who is silent (each second
while it lasts, deadlines.KEEPER_RECHECK_SECONDS), instead of waiting for the deadline."""
COORDINATOR_LATE_SECONDS = 2.0
"""The coordinator accepted the operator's asks (about one a second while watching, each given
run/keepers.GANG_ASK_TIMEOUT) and answered none for this long: at least two asks in a row,
about one of its keepers' heartbeats (coordinator.HOLD_SECONDS) past the first."""


def watching(obs: observed.Observed) -> bool:
    """Whether this pass should ask the gang's coordinator early: a job with restarts in place
    and a running spare, every pod of the attempt running, and no step seen for
    SUSPECT_SECONDS after the attempt has stepped."""
    s, fp = obs.status, obs.spec.failure_policy
    if not fp.in_place_restarts or not obs.spec.spares or s.last_progress_time is None:
        return False
    pods = obs.attempt_pods(s.attempt)
    if not pods or any(p.phase is not observed.PodPhase.RUNNING for p in pods):
        return False
    if not any(_standing_by(obs, p) for p in obs.spares):
        return False
    return obs.now - s.last_progress_time >= SUSPECT_SECONDS


def suspect(obs: observed.Observed) -> tuple[observed.PodView, str] | None:
    """The pod the coordinator reports frozen (its keeper alone silent, its node renewing its
    Lease since), or the coordinator's own pod (it accepts asks and answers none, its node
    renewing its Lease since), and words saying why; None when nothing is suspected (see the
    module)."""
    gang = obs.gang
    if not watching(obs) or gang is None:
        return None
    if not gang.answered:
        return _coordinator_frozen(obs, gang)
    if gang.final or gang.gathering:
        return None
    if len(gang.silent) != 1:
        return None
    ((rank, quiet),) = gang.silent.items()
    return _frozen_pod(obs, rank, quiet, f"node rank {rank}'s keeper silent for {quiet:.0f}s")


def _coordinator_frozen(
    obs: observed.Observed, gang: observed.GangHealth
) -> tuple[observed.PodView, str] | None:
    """Node rank 0's pod, when its keeper (the coordinator, which cannot name itself silent)
    has accepted the operator's asks and answered none for COORDINATOR_LATE_SECONDS while its
    node renewed its Lease a whole period after the first such ask: the process is there and
    says nothing, on a node that is alive. A coordinator that refuses or cannot be reached, or
    was late only once, is left to the deadline (and a lost node to the Lease path)."""
    late = gang.late_seconds
    if late is None or late < COORDINATOR_LATE_SECONDS:
        return None
    said = "node rank 0's keeper, the gang's coordinator, accepted asks and answered none"
    return _frozen_pod(obs, 0, late, f"{said} for {late:.0f}s")


def _frozen_pod(
    obs: observed.Observed, rank: int, quiet: float, silent: str
) -> tuple[observed.PodView, str] | None:
    """Node rank `rank`'s pod, silent for `quiet` seconds (as `silent` says), when its node
    renewed its Lease a whole period since and a spare stands by on another node."""
    pods = obs.attempt_pods(obs.status.attempt)
    pod = next((p for p in pods if p.rank == rank), None)
    node = obs.node(pod.node) if pod is not None and pod.node else None
    if pod is None or pod.deleting or node is None or not _alive_since(node, obs.now - quiet):
        return None
    if not any(_standing_by(obs, p) and p.node != pod.node for p in obs.spares):
        return None
    assert node.lease_renewed is not None  # _alive_since
    ago = obs.now - node.lease_renewed
    return (
        pod,
        f"{silent} while its node {node.name} renewed its Lease {ago:.1f}s ago: the pod is frozen",
    )


def _alive_since(node: observed.NodeView, silent_since: float) -> bool:
    """The node renewed its Lease a whole renew period after `silent_since` (renewals are seen
    by the watch a moment late: a lost node's last one may be seen just after its pods' last
    word, never a period after) and missed none since."""
    if not node.ready or node.lease_quiet or node.lease_silent_seconds is not None:
        return False
    if node.lease_renewed is None or node.lease_period is None:
        return False
    return node.lease_renewed - silent_since >= node.lease_period


def _standing_by(obs: observed.Observed, p: observed.PodView) -> bool:
    return (
        p.attempt == obs.status.attempt
        and p.phase is observed.PodPhase.RUNNING
        and not p.deleting
        and not decision.node_gone(obs, p)
    )
