"""Restarts in place: a gang's ranks restarted inside its running pods when
``failurePolicy.inPlaceRestarts`` is above 0.

Every pod of an attempt runs ``python -m fsdp_worker.keeper.gang <torchrun argv>``. The keeper
starts torchrun (generation 0) and stays beside it for the pod's life. When a rank fails, its
torchrun exits; its keeper reads the rank's termination message, tells the gang's coordinator (a
small TCP service the keeper of node rank 0 runs), and the coordinator moves the gang to the next
generation. Every keeper watches the coordinator: on a new generation it kills its torchrun's
whole process group at once (a survivor blocked in a collective goes down in a poll, not after
NCCL's timeout), reports it down, waits until every node is down, and starts its ranks again:
from its warm launcher (warm.py: forked from a process with torch imported) from generation 1
on, on every node alike. Rank 0's store is then new, every rank resumes (``auto``) from the
newest checkpoint sealed in this attempt (or the one the attempt started from), and no pod,
container or IP changes: no API-server round trip, no scheduling, no image start.

Why not torchrun's own elastic restarts (c10d rendezvous, ``--max-restarts``): measured here on
torch 2.15 with gloo, a restarted round reassigned node ranks (the operator reads rank 0's pod)
and its first round after a crash failed to connect gloo's mesh and needed a second. Why not the
kubelet's container restart rules: a node's container restarted alone joins the old store of a
rank 0 that has not yet noticed, and the kubelet's crash-loop backoff grows from the second
restart (docs/operator.md, "Restarts in place").

Escalation: a failure the keeper must not retry (a ConfigError, a non-retryable exit code, the
last in-place restart spent) ends its container with torchrun's exit code, leaving the rank's
termination message, and every other keeper stops its ranks and waits: the operator sees one
Failed pod and recreates the gang, as without this keeper. A keeper that loses the coordinator
(node 0's pod gone) also stops its ranks and waits for the operator: it recreates the gang, or,
with a warm spare (spec.spares), `promote`s the spare to node rank 0 (its keeper becomes the
coordinator, its ranks host the store) and tells every other keeper to `follow` it: they bring
what node 0's coordinator last told them (`rejoin`), and the gang restarts in place. Every
keeper therefore listens, on standby, on the coordinator's port.

The modules: gang.py is the keeper itself (`python -m fsdp_worker.keeper.gang`, the pod's
command) and its loop over generations; coordinator.py the service node rank 0's keeper runs
(a state machine that only answers); launchers.py starts a generation's ranks from torchrun or
the warm launcher, which is warm.py (the only module here that imports torch, in its own
process); ranks.py what a generation is told and what its end says; processes.py finds and
kills what a keeper launched; storeport.py has node rank 0 wait until the last generation's
store has let its port go; torchrun_argv.py rewrites torchrun's options; standby.py is a
waiting spare's readiness answer; guard.py the keeper port's envelope checks; silence.py when
a keeper judges the coordinator lost (gone: 10 s; slow, its asks accepted unanswered: 30 s).

The keeper imports no torch. The protocol is one JSON line each way per connection, typed and
versioned (contract/gangwire.py), signed with the attempt's key (a Secret the operator mounts;
FSDP_GANG names the file): guard.py checks a request's envelope (mac, job, attempt, time,
nonce) before the coordinator hears it, and what fails is refused, counted and logged. The
package imports `contract` (and the stdlib) only.
"""
