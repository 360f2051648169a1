"""Blame by cause, not by clock (detect._crashed): a truth table over the pods' own messages
and the order they ended in; the real ranks' messages are tests/worker/test_blame.py's."""

from __future__ import annotations

import json

import pytest

from fsdp_operator.policy import deadlines, detect
from fsdp_operator.types import api, observed, status
from fsdp_worker import contract
from fsdp_worker.telemetry import termination
from tests import builders

FAILED, RUNNING = observed.PodPhase.FAILED, observed.PodPhase.RUNNING
PEER = "[gloo/transport/tcp/pair.cc:545] Read error [10.244.1.2]:26527: Connection reset by peer"
TIMEOUT = "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation"


def msg(cls: str, text: str = "", **extra: object) -> str:
    return json.dumps(
        {"class": cls, "rank": 0, "step": 52, "exitCode": 1, "message": text, **extra}
    )


OWN = {
    "killed": msg(
        contract.FailureClass.KILLED, "rank 2 (local rank 0, pid 9) ended without a word"
    ),
    "silent": msg(
        contract.RecordClass.LIVE, phase="forward"
    ),  # killed without a word, its live record
    "exception": msg(contract.FailureClass.RUNTIME, "ValueError: a bug in the training code"),
    "oom": msg(contract.FailureClass.OOM, "CUDA out of memory"),
    "hang": msg(contract.FailureClass.HANG, "no step for 600s"),
    "config": msg(contract.FailureClass.CONFIG, "training.model.dim is required"),
}
SYMPTOMS = {
    "peer-gone": msg(contract.FailureClass.RUNTIME, PEER),
    "collective-timeout": msg(contract.FailureClass.RUNTIME, TIMEOUT),
    "save-peer-gone": msg(contract.FailureClass.CHECKPOINT, f"saving step 40 failed: {PEER}"),
}


def pod(
    rank: int,
    message: str,
    *,
    finished: float | None,
    phase: observed.PodPhase = FAILED,
    reason: str = "Error",
) -> observed.PodView:
    return builders.pod_view(
        name=f"job-a1-{rank}",
        attempt=1,
        rank=rank,
        phase=phase,
        exit_code=1,
        reason=reason,
        message=message,
        finished=finished,
    )


def verdict(pods: list[observed.PodView], *, now: float = 200.0) -> status.Failure | None:
    spec = api.FSDPJobSpec(replicas=len(pods), image="worker")
    obs = observed.Observed(
        spec=spec,
        status=status.FSDPJobStatus(attempt=1, replicas=len(pods)),
        generation=1,
        now=now,
        pods=pods,
    )
    return detect.detect(obs)


@pytest.mark.parametrize("own", sorted(OWN))
@pytest.mark.parametrize("sym", sorted(SYMPTOMS))
@pytest.mark.parametrize("survivor_first", [True, False])
def test_a_cause_of_its_own_beats_a_peers_symptom_either_way_round(
    own: str, sym: str, survivor_first: bool
) -> None:
    early, late = (100.0, 101.0) if survivor_first else (101.0, 100.0)
    pods = [pod(0, SYMPTOMS[sym], finished=early), pod(1, OWN[own], finished=late)]
    failure = verdict(pods)
    assert failure is not None and failure.pod == "job-a1-1", failure
    assert failure.symptoms and failure.symptoms[0].startswith("pod job-a1-0 (node rank 0)")
    assert failure.time == 100.0


def test_an_oom_kill_by_the_kubelet_is_a_cause_whatever_the_message() -> None:
    pods = [
        pod(0, SYMPTOMS["peer-gone"], finished=100.0),
        pod(1, SYMPTOMS["peer-gone"], finished=101.0, reason="OOMKilled"),
    ]
    failure = verdict(pods)
    assert failure is not None and failure.pod == "job-a1-1"
    assert failure.cause is status.Cause.OOM


def test_symptoms_alone_wait_for_the_pods_still_running_then_blame_the_earliest() -> None:
    """The survivor's pod ended on "peer gone" and the killed rank's pod still runs: no verdict
    for SYMPTOM_GRACE_SECONDS (its cause may come), and the loop is woken when that ends."""
    pods = [pod(0, SYMPTOMS["peer-gone"], finished=100.0), pod(1, "", finished=None, phase=RUNNING)]
    grace = deadlines.SYMPTOM_GRACE_SECONDS
    assert verdict(pods, now=100.0 + grace - 0.5) is None
    spec = api.FSDPJobSpec(replicas=2, image="worker")
    obs = observed.Observed(
        spec=spec,
        status=status.FSDPJobStatus(attempt=1, replicas=2),
        generation=1,
        now=101.0,
        pods=pods,
    )
    assert deadlines.next_deadline(obs) == 100.0 + grace
    late = verdict(pods, now=100.0 + grace)
    assert late is not None and late.pod == "job-a1-0" and late.cause is status.Cause.CRASH
    # Every pod ended with symptoms only: the earliest is blamed at once, the rest listed.
    both = [
        pod(0, SYMPTOMS["peer-gone"], finished=101.0),
        pod(1, SYMPTOMS["collective-timeout"], finished=100.0),
    ]
    failure = verdict(both, now=102.0)
    assert failure is not None and failure.pod == "job-a1-1"
    assert failure.symptoms == [f"pod job-a1-0 (node rank 0): PeerGone: {PEER}"]


def test_a_cause_of_its_own_is_blamed_at_once_while_others_still_run() -> None:
    pods = [pod(0, "", finished=None, phase=RUNNING), pod(1, OWN["exception"], finished=100.0)]
    failure = verdict(pods, now=100.5)
    assert failure is not None and failure.pod == "job-a1-1" and not failure.symptoms


@pytest.mark.parametrize(
    ("text", "symptom"),
    [
        (PEER, contract.Symptom.PEER_GONE),
        ("RuntimeError: Connection closed by peer [10.0.0.3]:5000", contract.Symptom.PEER_GONE),
        ("NCCL communicator was aborted on rank 3", contract.Symptom.PEER_GONE),
        ("DistNetworkError: failed to recv, got 0 bytes", contract.Symptom.PEER_GONE),
        (TIMEOUT, contract.Symptom.COLLECTIVE_TIMEOUT),
        (
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
            "OpType=ALLREDUCE) ran for 600000 milliseconds",
            contract.Symptom.COLLECTIVE_TIMEOUT,
        ),
        ("ValueError: a bug in the training code", None),
        ("TimeoutError: the data loader's worker did not answer", None),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", None),
    ],
)
def test_what_reads_as_a_symptom(text: str, symptom: contract.Symptom | None) -> None:
    assert contract.symptom_of(text) is symptom


def test_a_symptom_pod_is_never_blamed_over_a_later_cause_in_a_big_gang() -> None:
    """Eight pods: seven ended on symptoms before the one whose rank was killed."""
    pods = [pod(r, SYMPTOMS["peer-gone"], finished=100.0 + r) for r in range(7)]
    pods.append(pod(7, OWN["silent"], finished=120.0))
    failure = verdict(pods, now=130.0)
    assert failure is not None and failure.pod == "job-a1-7" and len(failure.symptoms) == 7


@pytest.mark.parametrize(
    ("stat", "runs"),
    [
        pytest.param("41 (python) S 40 40 1 0 -1 4194560 9 0 0 0", True, id="sleeping"),
        pytest.param("41 (rank-3 (x)) R 40 40 1 0 -1 4194304 9 0 0 0", True, id="name-with-parens"),
        pytest.param("41 (python) R 40 40 1 0 -1 4194308 9 0 0 0", False, id="exiting"),
        pytest.param("41 (python) Z 40 40 1 0 -1 4227084 9 0 0 0", False, id="zombie"),
        pytest.param("41 (python) X 40 40 1 0 -1 0 9 0 0 0", False, id="dead"),
        pytest.param("41 (python)", False, id="cut-short"),
    ],
)
def test_a_sibling_that_has_begun_to_exit_no_longer_runs(stat: str, runs: bool) -> None:
    """A killed rank closes its sockets while it exits (the kernel's PF_EXITING set), before it
    is a zombie: its sibling, woken by the closed connection, must see it gone, or its pod's
    failure reads as a survivor's (tests/worker/test_blame.py's kill-local-1 under load)."""
    assert termination.running_by_stat(stat) is runs
