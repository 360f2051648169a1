"""A lost node's writer that lives on (issue 42's lost job): the fence race, both ways, on the
kubelet nodes.

On a fresh machine `make test` once lost a whole job this way: a node was lost, its rank 0 went
on writing after the next attempt had chosen its resume point, and something of the old
attempt removed that step; the next attempt then refused to start over and the job failed.
tests/unit/test_fence.py pauses a real writer before each of its acts; this runs the race for
real: the lost node's pods are frozen with its kubelet, the next attempt is launched elsewhere,
and then the frozen writer is let go (its kubelet still stopped, so nothing stops it: a node
cut off from the cluster that still reaches its storage) while the new attempt's pod is held
in an init container. The old writer publishes steps past the new attempt's resume point
*before* the new attempt takes the root over, and is refused *after*; the job succeeds from
the step the operator chose, in the attempt it launched.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fsdp_operator.types import names
from fsdp_worker.contract import catalog
from localcluster import faults as lf
from localcluster import images, poll
from tests.integration import harness

HOLD_SECONDS = 10  # the new attempt's pod waits this long in an init container before its rank


def _published(root: Path) -> dict[int, int]:
    """Each sealed step in the job's root -> the attempt that wrote it (its marker)."""
    found = {}
    for step_dir in root.glob("step-*"):
        try:
            marker = json.loads((step_dir / catalog.MARKER_NAME).read_text())
        except (OSError, ValueError):
            continue  # not sealed, or renamed away while read
        found[int(marker["step"])] = int(marker["attempt"])
    return found


def _writers(root: Path) -> set[str]:
    return {p.name for p in root.glob(".writer-*")}


def _watch(root: Path, until: float, done: Any) -> dict[int, int]:
    """Poll the root until `done()` (asked about once a second) or `until`: the attempt-1 steps
    seen sealed while no writer directory of attempt 2 existed yet (before its take-over)."""
    before: dict[int, int] = {}
    polls = 0
    while time.monotonic() < until and not (polls % 5 == 0 and done()):
        polls += 1
        if not any(w.startswith(".writer-a2") for w in _writers(root)):
            before.update({s: a for s, a in _published(root).items() if a == 1})
        time.sleep(0.2)
    return before


def test_a_lost_writer_publishes_before_the_new_attempt_takes_over_and_nothing_after(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("zombie")
    hold = {
        "name": "hold",
        "image": images.WORKER,
        "command": ["python", "-c", f"import time; time.sleep({HOLD_SECONDS})"],
    }
    doc = harness.job_doc(name, replicas=1, minReplicas=1, training={"steps": 400})
    doc["spec"]["template"]["spec"]["initContainers"] = [hold]
    jobs.apply(doc)
    faults = lf.Faults.for_cluster(operator.cluster.state_dir)
    root = jobs.ckpt_dir(name)

    def why() -> str:
        s = jobs.status(name)
        return f"{json.dumps(s)[:3000]}\nevents: {jobs.events(name)}\n{operator.log_tail()}"

    pod = poll.until(
        "rank 0 stepping past step 12",
        lambda: (jobs.status(name).get("step") or 0) >= 12 and jobs.running_pods(name, 1),
        timeout=120,
        diagnosis=why,
    )[0]
    node, zombie = pod["spec"]["nodeName"], pod["metadata"]["name"]
    faults.lose_node(node, freeze=names.Label.JOB.value)
    try:
        s = poll.until(
            "attempt 2 launched after NodeLost",
            lambda: (s := jobs.status(name)).get("attempt", 0) >= 2 and s,
            timeout=90,
            diagnosis=why,
        )
        resumed = s["history"][-1].get("resumedFromStep")
        assert s["lastFailure"]["cause"] == "NodeLost" and resumed is not None, why()
        faults.thaw_pods(node)  # the old writer goes on; the new attempt's rank is held

        def refused() -> bool:
            return "was superseded" in faults.pod_log(node, jobs.ns, zombie)

        before = _watch(root, time.monotonic() + 90, refused)
        log = faults.pod_log(node, jobs.ns, zombie)
        # One way: the old attempt published past the resume point before the take-over...
        ahead = {step for step, attempt in before.items() if step > resumed}
        print(f"zombie: attempt 2 resumes from {resumed}; attempt 1 sealed {sorted(ahead)} first")
        assert ahead, f"no step of attempt 1 past {resumed} before the take-over\n{log[-3000:]}"
        # ...the other: once attempt 2 held the root, the old writer was refused
        assert "attempt 2 now writes" in log and "was superseded" in log, log[-3000:]
    finally:
        faults.restore_node(node)
    done = poll.until(
        "Succeeded",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=180,
        diagnosis=why,
    )
    # The job finished in the attempt it launched, from the step the operator chose
    assert done["attempt"] == 2 and done["history"][-1]["resumedFromStep"] == resumed, why()
    final = _published(root)
    assert final.get(resumed) is not None, final  # the resume point was never removed
    assert all(a == 2 for step, a in final.items() if step > resumed), final  # none of the old
    assert final.get(400) == 2, final
