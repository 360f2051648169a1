"""Pod start latency on an idle kubelet node: created -> Running, as a client sees it.

Starts its own local cluster (1 node, images cached), then for each image creates one pod at
a time (restricted, uid 1000) and times `kubectl create` returning -> the API server reporting
phase Running, polling every 50 ms (Kubernetes' own timestamps have 1 s resolution). Results
in bench/results/pod_start.json.

    PYTHONPATH=. .venv/bin/python bench/pod_start.py [--pods 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from localcluster import controlplane, images

RESULTS = Path(__file__).parent / "results" / "pod_start.json"


def _pod(name: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["python", "-c", "import time; time.sleep(600)"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                }
            ],
        },
    }


def _time_one(cluster: controlplane.Cluster, name: str, image: str) -> float:
    cluster.kubectl("create", "-f", "-", input=json.dumps(_pod(name, image)))
    started = time.monotonic()
    while True:
        phase = cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
        if phase == "Running":
            elapsed = time.monotonic() - started
            break
        if time.monotonic() - started > 120:
            raise RuntimeError(f"{name} not Running after 120 s (phase {phase!r})")
        time.sleep(0.05)
    cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=10)
    args = parser.parse_args()
    images.build(images.TEST_TARGETS)
    results: dict[str, Any] = {
        "machine": "2 cores, 24 GiB, no GPU; 1 kubelet node (containerd)",
        "date": time.strftime("%Y-%m-%d"),
        "pods": args.pods,
    }
    with tempfile.TemporaryDirectory() as tmp:
        wanted = controlplane.NodeOptions(1, images=images.TEST_IMAGES)
        up = time.monotonic()
        cluster = controlplane.Cluster.up(Path(tmp) / "cluster", nodes=wanted)
        results["cluster_up_seconds"] = round(time.monotonic() - up, 2)
        try:
            time.sleep(5)  # let the node settle: the first sync after Ready is busy
            for label, ref in (("operator", images.OPERATOR), ("worker", images.WORKER)):
                times = [_time_one(cluster, f"{label}-{i}", ref) for i in range(args.pods)]
                results[label] = {
                    "p50_s": round(statistics.median(times), 3),
                    "max_s": round(max(times), 3),
                    "all_s": [round(t, 3) for t in times],
                }
                print(label, results[label])
        finally:
            cluster.down()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
