"""`make demo`: a real FSDP2 job on the local cluster survives a crash and a lost node.

Starts the control plane and two kubelet nodes (containerd, the project's worker image), installs
the CRD and the operator (with the
chart's RBAC), applies examples/tiny-cpu.yaml (2 pods x 2 CPU ranks, real torchrun, FSDP2, DCP),
then injects faults and narrates what the operator does:

1. a rank crashes -> gang restart from the newest complete checkpoint;
2. a node is lost -> NotReady -> force-delete -> restart on the nodes left (shrunk world);
3. the node returns -> planned restart back at full size, no step lost;
and the job runs to Succeeded. Everything is torn down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from fsdp_operator.types import names
from harness import stack
from localcluster import controlplane, faults, images, poll

console = Console()
NS = "demo"


def _say(text: str) -> None:
    console.print(f"\n[bold cyan]==>[/bold cyan] {text}")


def _show(cluster: controlplane.Cluster) -> None:
    out = cluster.kubectl("get", "fsdpjob", "-n", NS).stdout.rstrip()
    console.print(out)


def _job() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((stack.ROOT / "examples" / "tiny-cpu.yaml").read_text())
    # Long enough to watch three recoveries and the grow-back: at 400 steps (torch 2.15) the job
    # finished before the returning node's exclusion ended, so it never grew back; at 2000 the
    # grow-back came at step 531.
    doc["spec"]["training"]["steps"] = 1200
    doc["spec"]["image"] = images.WORKER  # built here: no registry is reachable
    return doc


def _await(jobs: stack.Jobs, what: str, probe: Any, timeout: float = 240) -> Any:
    def show() -> str:
        return json.dumps(jobs.status("tiny-cpu"), indent=1)[:2000]

    return poll.until(what, probe, timeout=timeout, every=1.0, diagnosis=show)


def _full(s: dict[str, Any]) -> bool:
    return s.get("replicas") == 2 and s.get("attempt", 0) >= 4 and s.get("phase") == "Running"


def _step(jobs: stack.Jobs) -> int:
    return int(jobs.status("tiny-cpu").get("step") or 0)


def run(cluster: controlplane.Cluster, log_dir: Path) -> None:
    stack.install_crd(cluster)
    op = stack.Operator(cluster, stack.install_rbac(cluster), log_dir, worker_module="fsdp_worker")
    op.start()
    try:
        cluster.kubectl("create", "namespace", NS)
        jobs = stack.Jobs(cluster, NS)
        jobs.ensure_pvc()
        _say("kubectl apply -f examples/tiny-cpu.yaml  (2 pods x 2 ranks, FSDP2 on CPU/gloo)")
        jobs.apply(_job())
        _await(jobs, "training to pass step 25", lambda: _step(jobs) >= 25)
        _show(cluster)
        injector = faults.Faults.for_cluster(cluster.state_dir)
        pod = jobs.running_pods("tiny-cpu", 1)[1]["metadata"]["name"]
        _say(f"fault 1: SIGKILL training rank 2 inside {pod} (torchrun sees a crashed rank)")
        injector.kill_rank(NS, pod, rank=2)
        s = _await(
            jobs,
            "attempt 2 running",
            lambda: (s := jobs.status("tiny-cpu")).get("attempt") == 2
            and s.get("phase") == "Running"
            and s,
        )
        console.print(
            f"restarted from step {s['resumedFromStep']}; cause {s['lastFailure']['cause']}"
        )
        _await(
            jobs, "progress past the resume point", lambda: _step(jobs) > s["resumedFromStep"] + 5
        )
        node = jobs.running_pods("tiny-cpu", 2)[1]["spec"]["nodeName"]
        _say(f"fault 2: lose node {node} (its kubelet stops; its containers keep running)")
        injector.lose_node(node, freeze=names.Label.JOB.value)
        s = _await(
            jobs,
            "shrunk attempt running",
            lambda: (s := jobs.status("tiny-cpu")).get("attempt") == 3
            and s.get("phase") == "Running"
            and s,
        )
        console.print(f"cause {s['lastFailure']['cause']}; world size now {s['worldSize']} ranks")
        _show(cluster)
        _say(f"node {node} comes back: the operator grows the job back after a checkpoint")
        injector.restore_node(node)
        _await(jobs, "back at full size", lambda: _full(jobs.status("tiny-cpu")))
        _show(cluster)
        _say("letting the job finish")
        _await(
            jobs,
            "Succeeded",
            lambda: jobs.status("tiny-cpu").get("phase") == "Succeeded",
            timeout=600,
        )
        _show(cluster)
        # what a user runs next; a CLI that fails here fails the demo (it once crashed on a
        # gloo error's brackets while the demo still exited 0)
        for command in ("describe", "why"):
            subprocess.run(
                [sys.executable, "-m", "fsdp_operator.cli", "-n", NS, command, "tiny-cpu"],
                env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
                check=True,
            )
    finally:
        op.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harness.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="fsdp-demo-"))
    _say(f"starting the local cluster (control plane + 2 kubelet nodes) in {state}")
    started = time.monotonic()
    images.build(images.TEST_TARGETS)
    wanted = controlplane.NodeOptions(2, images=(images.WORKER,))
    cluster = controlplane.Cluster.up(state / "cluster", nodes=wanted)
    console.print(f"ready in {time.monotonic() - started:.1f}s; KUBECONFIG={cluster.kubeconfig}")
    try:
        run(cluster, state)
        _say(f"demo finished in {time.monotonic() - started:.0f}s")
        return 0
    finally:
        if not args.keep:
            cluster.down()


if __name__ == "__main__":
    sys.exit(main())
