"""A straggler found and swapped out (issue 48 item 4): real torch ranks, one pod's CPU throttled
to about half its speed through its cgroup, a warm spare on the third node.

Not in tests/integration: the stand-in worker steps on its own clock and measures no pace, so
only the built-in trainer (its rank 0 names the slow rank from the ranks' compute per step) can
show a straggler. Needs this machine's cgroups (localcluster.faults.throttle): skipped on kind.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from fsdp_operator.types import names
from harness import stack
from localcluster import faults as local_faults
from localcluster import poll
from tests.e2e.conftest import E2E, spare_job

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(900)]
NPROC = 2
STEPS = 5000  # ~0.2 s each: never done before the swap is seen (the job is deleted after)


def _rate(jobs: stack.Jobs, name: str, attempt: int, seconds: float = 30.0) -> float:
    """`attempt`'s steps per second, between two moments status.step changed (each is a scrape
    of rank 0's live step) at least `seconds` apart."""

    def scraped(after: int) -> tuple[int, float] | None:
        s = jobs.status(name)
        step = s.get("step") or 0
        return (step, time.monotonic()) if s.get("attempt") == attempt and step > after else None

    def next_scrape() -> tuple[int, float]:
        now = jobs.status(name).get("step") or 0
        return poll.until(
            f"a new step of attempt {attempt}",
            lambda: scraped(now),
            timeout=60,
            every=0.5,
            diagnosis=lambda: jobs.diagnosis(name),
        )

    step0, t0 = next_scrape()
    time.sleep(seconds)
    step1, t1 = next_scrape()
    return (step1 - step0) / (t1 - t0)


def _gang(jobs: stack.Jobs, name: str, attempt: int) -> tuple[dict, dict] | None:
    """`attempt`'s node ranks 0 and 1, once both run."""
    running = jobs.running_pods(name, attempt)
    gang = {p["metadata"]["labels"].get(names.Label.NODE_RANK.value): p for p in running}
    return (gang["0"], gang["1"]) if {"0", "1"} <= gang.keys() else None


def _gang_and_spare(jobs: stack.Jobs, name: str, attempt: int) -> tuple[dict, dict, dict] | None:
    gang = _gang(jobs, name, attempt)
    running = jobs.running_pods(name, attempt)
    spare = [p for p in running if names.Label.SPARE.value in p["metadata"]["labels"]]
    return (*gang, spare[0]) if gang and spare else None


def test_a_throttled_pod_is_swapped_for_the_spares_node_at_a_save_with_no_step_lost(
    e2e: E2E, namespace: str
) -> None:
    faults = e2e.faults
    if not isinstance(faults, local_faults.Faults):
        pytest.skip(
            "needs this machine's node cgroups to throttle (localcluster.faults); kind's nodes"
            " are Docker containers"
        )
    jobs, name = stack.Jobs(e2e.kube, namespace), "straggler"
    # rank 0 names a slow rank from its 20-step windows; status.slowRank follows each scrape
    jobs.apply(spare_job(e2e, name, nproc=NPROC, steps=STEPS, swapSlowNodes=True))
    trained = poll.until(
        "a gang training (step >= 30)",
        lambda: ((s := jobs.status(name)).get("step") or 0) >= 30 and s,
        timeout=360,
        diagnosis=lambda: jobs.diagnosis(name),
    )
    attempt = trained["attempt"]
    rank0, victim, spare = poll.until(
        "the gang and its spare running",
        lambda: _gang_and_spare(jobs, name, attempt),
        timeout=120,
        diagnosis=lambda: jobs.diagnosis(name),
    )
    before = _rate(jobs, name, attempt)
    slow_node, spare_node = victim["spec"]["nodeName"], spare["spec"]["nodeName"]
    pod = victim["metadata"]["name"]
    throttled_at = jobs.status(name).get("step") or 0
    # half the CPU the pod uses now (measured over 2 s): its ranks' compute at half speed. Half
    # of NPROC cores would not slow it: these ranks wait for their peers two thirds of a step.
    set_to = faults.throttle(namespace, pod, fraction=0.5)
    print(f"{pod} on {slow_node} throttled at step {throttled_at}: {set_to}")
    try:
        named = poll.until(
            "the SlowRank Event naming the throttled pod",
            lambda: [m for m in jobs.messages(name, "SlowRank") if pod in m],
            timeout=240,
            diagnosis=lambda: jobs.diagnosis(name),
        )
        slow = jobs.status(name).get("slowRank") or {}
        print(f"named at step {slow.get('sinceStep')} ({throttled_at} throttled): {named[0]}")

        def swapped() -> dict[str, Any] | None:
            entry = next(
                (e for e in jobs.status(name).get("history", []) if e["attempt"] == attempt), {}
            )
            return entry if entry.get("cause") == "Straggler" else None

        ended = poll.until(
            "the slow node swapped out",
            swapped,
            timeout=240,
            diagnosis=lambda: jobs.diagnosis(name),
        )
    finally:
        with contextlib.suppress(local_faults.FaultError):  # its pod is gone after a swap
            faults.unthrottle(namespace, pod)
    swap = ended["swap"]
    assert (swap["pod"], swap["node"]) == (pod, slow_node), swap
    assert swap["rank"] // NPROC == 1 and swap["slowdown"] >= 1.5, swap
    assert (swap["spare"], swap["spareNode"]) == (spare["metadata"]["name"], spare_node), swap
    # the pass posts its Events after the status that ended the attempt
    said = poll.until(
        "the Straggler Event",
        lambda: jobs.messages(name, "Straggler"),
        timeout=60,
        diagnosis=lambda: jobs.diagnosis(name),
    )
    assert said and said[0].startswith(f"swapped out: rank {swap['rank']} (pod {pod}"), said

    def resumed() -> dict[str, Any] | None:
        s = jobs.status(name)
        entry = next((e for e in s.get("history", []) if e["attempt"] == attempt + 1), {})
        return s if entry.get("resumedFromStep") is not None else None

    s = poll.until(
        "the next attempt resumed", resumed, timeout=300, diagnosis=lambda: jobs.diagnosis(name)
    )
    entry = next(e for e in s["history"] if e["attempt"] == attempt + 1)
    # Zero steps lost: the gang saved on SIGTERM at or past the step the swap began at.
    assert entry["resumedFromStep"] >= swap["step"], (entry, swap)
    assert s["restarts"]["total"] == 0, s["restarts"]  # planned: no budget charged
    # The spare's node stood free: the slow one is kept out (settings.nodeExclusionSeconds).
    pods = poll.until(
        "the next attempt's gang running",
        lambda: _gang(jobs, name, attempt + 1),
        timeout=120,
        diagnosis=lambda: jobs.diagnosis(name),
    )
    on = {p["spec"]["nodeName"] for p in pods}
    assert on == {rank0["spec"]["nodeName"], spare_node} and slow_node not in on, on
    after = _rate(jobs, name, attempt + 1)
    print(
        f"swap at step {swap['step']}, resumed from {entry['resumedFromStep']} "
        f"(stepsLost {ended.get('stepsLost')}); steps/s {before:.2f} unthrottled, "
        f"{after:.2f} after the swap ({after / before:.0%}; the goal is within 5 %)"
    )
    # a rate, printed for the note: bench/ territory, not an assertion on a shared machine
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", namespace, "--wait=false")
