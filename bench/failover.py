"""Benchmark: how long the operator is gone when its leader is (leader election on a Lease).

Starts its own control plane (no nodes: a pass needs an FSDPJob, not running pods), the CRD and
the chart's RBAC, one FSDPJob, and two operator processes (identities fo-a, fo-b). Each trial
takes the leader away and measures, on this machine's clock:

- kill: SIGKILL of the leader -> the standby holding the Lease (its leader gauge) -> the
  standby's first reconcile pass (its pass counter above 0). Goal <= 17 s: the lease lasts 15 s
  from the dead leader's last renewal (<= 2 s before the kill), seen by the standby's tries
  every 2 s;
- clean: SIGTERM (the leader cancels its loops and releases the Lease) -> the same two
  moments. Goal <= 3 s.

The replica taken away is started again as the new standby before the next trial. Writes
bench/results/failover.json and prints p50/max. Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import stack
from localcluster import controlplane
from tests.integration import harness

OUT = Path(__file__).resolve().parent / "results" / "failover.json"
LEADER = "fsdpjob_operator_leader"
PASSES = "fsdpjob_reconcile_passes_total"


def _until(what: str, probe: Any, timeout: float, every: float = 0.02) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return time.time()
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


def _standby_ready(op: stack.Operator) -> None:
    op.start()
    _until(f"{op.identity} standing by", lambda: op.sample(LEADER) == 0, 60, every=0.2)
    time.sleep(3.0)  # its watches listed, its first lease reads done: a warm standby


def trial(mode: str, leader: stack.Operator, standby: stack.Operator) -> dict[str, float]:
    t0 = time.time()
    if mode == "kill":
        leader.kill()
    else:
        leader.terminate()
    led = _until("the standby leading", lambda: standby.sample(LEADER) == 1, 60)
    first = _until("its first pass", lambda: (standby.sample(PASSES) or 0) > 0, 30)
    if leader.proc is not None:
        leader.proc.wait(30)
    return {"lease_seconds": led - t0, "first_pass_seconds": first - t0}


def _summary(rows: list[dict[str, float]], key: str) -> dict[str, float]:
    values = sorted(r[key] for r in rows)
    return {"p50": statistics.median(values), "max": values[-1], "min": values[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=10, help="per mode")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what it started, then exit
    results: dict[str, Any] = {"trials": args.trials, "goal_seconds": {"kill": 17, "clean": 3}}
    with tempfile.TemporaryDirectory(prefix="failover-") as tmp:
        root = Path(tmp)
        cluster = controlplane.Cluster.up(
            root / "cluster", nodes=controlplane.NodeOptions(nodes=0), timeout=180
        )
        ops: list[stack.Operator] = []
        try:
            stack.install_crd(cluster)
            kubeconfig = stack.install_rbac(cluster)
            cluster.kubectl("create", "namespace", "failover")
            stack.Jobs(cluster, "failover").apply(harness.job_doc("failover-probe"))
            for name in ("a", "b"):
                (root / name).mkdir()
                ops.append(stack.Operator(cluster, kubeconfig, root / name, identity=f"fo-{name}"))
            ops[0].start()
            _until("fo-a leading", lambda: ops[0].sample(LEADER) == 1, 60, every=0.2)
            _standby_ready(ops[1])
            for mode in ("kill", "clean"):
                rows = []
                for i in range(args.trials):
                    leader, standby = (
                        (ops[0], ops[1]) if ops[0].sample(LEADER) else (ops[1], ops[0])
                    )
                    row = trial(mode, leader, standby)
                    rows.append(row)
                    print(
                        f"{mode} {i + 1}/{args.trials}: lease {row['lease_seconds']:.2f} s, "
                        f"first pass {row['first_pass_seconds']:.2f} s",
                        flush=True,
                    )
                    _standby_ready(leader)
                results[mode] = {
                    "rows": rows,
                    "lease_seconds": _summary(rows, "lease_seconds"),
                    "first_pass_seconds": _summary(rows, "first_pass_seconds"),
                }
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=2) + "\n")
        finally:
            for op in ops:
                op.kill()
            cluster.down()
    print(f"\n{'mode':<6} {'first pass p50':>15} {'max':>8} {'goal':>6}")
    for mode in ("kill", "clean"):
        s = results[mode]["first_pass_seconds"]
        print(
            f"{mode:<6} {s['p50']:>13.2f} s {s['max']:>6.2f} s {results['goal_seconds'][mode]:>4} s"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
