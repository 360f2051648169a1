"""Benchmark: the operator at fleet scale, on a control plane with kwok's fake GPU nodes.

Starts its own control plane (no kubelet nodes) and a kwok fleet (localcluster/kwok.py), installs
the CRD and the chart's RBAC, and for each job count (increasing; a fresh operator process and a
fresh namespace each, the previous size's jobs deleted and gone) measures, with one clock fed by
watches on pods and FSDPJobs:

- bring-up: apply -> every job Running; per job, (job Running) - (all its pods Running), p95 and
  max (goal: every job within 60 s of its pods); reconcile passes per second meanwhile;
- memory: the operator's RSS idle (goal <= 150 MiB) and with the jobs Running and settled, as
  KiB per job (goal <= 100);
- steady state: the operator's CPU (% of one core, goal <= 10) and API requests per second by
  verb, and LIST calls per reconcile pass (goal 0);
- failures: rank 0 of distinct random jobs fails (kwok's chaos stage, exit code 1); the failed
  pod seen Failed -> every pod of the next attempt seen ADDED, p50/p95 (goal p95 <= 3 s);
- the baseline (bench/fleet_baseline.py, first, in its own namespace; --no-baseline skips it):
  the same pods as plain ReplicaSets, brought up and failed the same way, and the operator's
  bring-up and replacement as ratios to it (`ratio_*`), so a slower machine does not read as a
  slower operator.

With --heap-report the operator writes a heap report (fsdp_operator/io/heap.py) idle and once the
jobs settled, each right after the RSS it goes with is read; the second, what the jobs added, is
kept as bench/results/fleet-heap-<jobs>.txt. Metrics the operator does not export yet are null.
Results go to bench/results/fleet.json after every size and into a plot (docs/fleet.png);
--replot redraws it from the JSON. Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import fleet_baseline, fleet_clock, fleet_plot
from fsdp_operator.types import names
from harness import stack
from localcluster import components, controlplane, images, kubeclient, kwok, nodes, poll

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "fleet.json"
PLOT = ROOT / "docs" / "fleet.png"
GROUP_PATH = "/apis/fsdpoperator.io/v1alpha1"
GOALS = {
    "job_lag_s": 60.0,
    "replace_p95_s": 3.0,
    "idle_mib": 150.0,
    "kib_per_job": 100.0,
    "cpu_pct": 10.0,
    "list_per_pass_steady": 0.0,
    "passes_per_s": 50.0,
}


def job_doc(name: str, *, pods: int, gpus_per_pod: int) -> dict[str, Any]:
    """An FSDPJob whose pods land on the fleet; fake pods serve no metrics, so no hang deadline."""
    return {
        "apiVersion": "fsdpoperator.io/v1alpha1",
        "kind": "FSDPJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": pods,
            "minReplicas": pods,
            "nprocPerNode": 1,
            "image": images.WORKER,
            "resources": {"limits": {nodes.GPU_RESOURCE: str(gpus_per_pod)}},
            "training": {"steps": 1_000_000, "globalBatchSize": pods, "microBatchSize": 1},
            "checkpoint": {"root": "/ckpt", "intervalSteps": 1000},
            "failurePolicy": {
                "maxRestarts": 1000,
                "backoff": {"initialSeconds": 0, "maxSeconds": 0},
                "progressDeadlineSeconds": 86_400,
                "pendingTimeoutSeconds": 3600,
                "nodeLossGraceSeconds": 60,
            },
            "template": {
                "spec": {"nodeSelector": kwok.NODE_SELECTOR, "tolerations": [kwok.toleration()]}
            },
        },
    }


# --- the operator process: /proc and its metrics ----------------------------------------------
def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import parser

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    families = parser.text_string_to_metric_families(text)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
    }


def total(samples: dict[Any, float], name: str, **match: str) -> float | None:
    """The sum of ``name``'s samples whose labels match (case-insensitive); None when absent."""
    hits = [
        v
        for (n, labels), v in samples.items()
        if n == name
        and all(dict(labels).get(k, "").lower() == want.lower() for k, want in match.items())
    ]
    return sum(hits) if any(n == name for n, _ in samples) else None


def by_verb(samples: dict[Any, float], *, resource: bool = False) -> dict[str, float]:
    """API requests so far by verb (or by "verb resource")."""
    verbs: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == "fsdpjob_operator_api_requests_total":
            found = dict(labels)
            key = found.get("verb", "?").lower()
            key = f"{key} {found.get('resource', '?')}" if resource else key
            verbs[key] = verbs.get(key, 0.0) + v
    return verbs


def per_second(after: dict[str, float], before: dict[str, float], seconds: float) -> Any:
    return {k: (v - before.get(k, 0.0)) / seconds for k, v in after.items()} if after else None


def api_window(
    before: dict[Any, float], after: dict[Any, float], seconds: float, phase: str
) -> dict[str, Any]:
    """Passes and API requests between two scrapes, per second and LIST per pass (null where
    the operator exports no such metric; LIST per pass is 0 when there was no LIST at all)."""
    p0, p1 = (total(m, "fsdpjob_reconcile_passes_total") for m in (before, after))
    passes = None if p0 is None or p1 is None else p1 - p0
    verbs0, verbs1 = by_verb(before), by_verb(after)
    lists = verbs1.get("list", 0.0) - verbs0.get("list", 0.0) if verbs1 else None
    per_pass = _per_pass(lists, passes)
    each = per_second(by_verb(after, resource=True), by_verb(before, resource=True), seconds)
    return {
        f"passes_per_s_{phase}": None if passes is None else passes / seconds,
        f"api_per_s_{phase}": per_second(verbs1, verbs0, seconds),
        f"api_per_s_by_resource_{phase}": each,
        f"list_per_s_{phase}": None if lists is None else lists / seconds,
        f"list_per_pass_{phase}": per_pass,
    }


def _per_pass(lists: float | None, passes: float | None) -> float | None:
    if lists is None:
        return None
    if lists == 0:
        return 0.0  # no LIST at all, whatever the passes
    return lists / passes if passes else None


def pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else None


# --- one size ---------------------------------------------------------------------------------
class Size:
    """One job count: its namespace, operator, clock and measurements."""

    def __init__(
        self,
        *,
        fleet: kwok.Fleet,
        kubeconfig: Path,
        log_dir: Path,
        args: argparse.Namespace,
        jobs: int,
    ) -> None:
        self.fleet, self.cluster, self.args, self.jobs = fleet, fleet.cluster, args, jobs
        self.ns = f"fleet-{jobs}"
        self.kube = kubeclient.Kube(self.cluster.kubeconfig)
        self.op = stack.Operator(self.cluster, kubeconfig, log_dir)
        self.log_dir = log_dir
        self.clock: fleet_clock.Clock | None = None
        self.row: dict[str, Any] = {"jobs": jobs, "pods": jobs * args.pods_per_job}

    def names(self) -> list[str]:
        return [f"job-{i:05d}" for i in range(self.jobs)]

    def run(self) -> dict[str, Any]:
        self.cluster.kubectl("create", "namespace", self.ns)
        try:
            if self.args.baseline:
                self.row |= fleet_baseline.measure(
                    self.fleet,
                    jobs=self.jobs,
                    pods_per_job=self.args.pods_per_job,
                    gpus_per_pod=self.args.gpus_per_pod,
                    failures=self.args.failures,
                    spacing=self.args.failure_spacing,
                    seed=self.args.seed,
                    wait_seconds=self.args.wait_seconds,
                )
            self._start_operator()
            self.clock = fleet_clock.Clock(self.kube, self.ns, pods_per_job=self.args.pods_per_job)
            self._bring_up()
            self._settle_and_steady()
            self._failures()
            self._restart()
            self.row |= fleet_baseline.ratios(self.row)
        except AssertionError as exc:  # a wait ran out: keep what was measured, go on
            self.row["error"] = str(exc).splitlines()[0]
            print(f"jobs={self.jobs}: {exc}", flush=True)
        finally:
            if self.clock is not None:
                self.clock.stop()
            try:
                self._clean_up()
            except Exception as exc:  # what was measured is kept; the next size gets a warning
                self.row["cleanup_error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(f"jobs={self.jobs}: clean-up failed: {exc}", flush=True)
        return self.row

    def _start_operator(self) -> None:
        if self.args.heap_report:
            os.environ["FSDPOP_HEAP_REPORT"] = str(self.log_dir / f"heap-{self.jobs}")
            self.row["heap_report_frames"] = self.args.heap_frames
        self.op.start()
        poll.until(
            "operator metrics",
            lambda: self._try_scrape() is not None,
            timeout=self.args.wait_seconds if self.args.heap_frames else 120,
            diagnosis=self.op.log_tail,
        )
        time.sleep(self.args.idle_seconds)
        assert self.op.proc is not None
        self.row["rss_idle_kib"] = rss_kib(self.op.proc.pid)
        self.row["rss_idle_metric_bytes"] = total(self._scrape(), "process_resident_memory_bytes")
        self._heap_report(1)

    def _heap_report(self, n: int) -> str:
        """With --heap-report: SIGUSR2 to the operator, its n-th heap report
        (fsdp_operator/io/heap.py): the first idle, the second what the jobs added); "" without."""
        if not self.args.heap_report:
            return ""
        assert self.op.proc is not None
        path = Path(os.environ["FSDPOP_HEAP_REPORT"] + f".{n}")
        self.op.proc.send_signal(signal.SIGUSR2)
        poll.until(
            f"heap report {path}", path.exists, timeout=600, every=1.0, diagnosis=self.op.log_tail
        )
        time.sleep(1.0)  # written in one call; let it finish
        return path.read_text()

    def _try_scrape(self) -> dict[Any, float] | None:
        try:
            return self._scrape()
        except OSError:  # not listening yet
            return None

    def _scrape(self) -> dict[Any, float]:
        return scrape(self.op.metrics_url())

    def _bring_up(self) -> None:
        assert self.clock is not None
        before = self._scrape()
        assert self.op.proc is not None
        cpu0, t0 = cpu_seconds(self.op.proc.pid), time.monotonic()
        applied = time.time()
        docs = [
            job_doc(n, pods=self.args.pods_per_job, gpus_per_pod=self.args.gpus_per_pod)
            for n in self.names()
        ]
        path = f"{GROUP_PATH}/namespaces/{self.ns}/fsdpjobs"
        with _pool() as pool:
            list(pool.map(lambda doc: self.kube.request("POST", path, body=doc), docs))
        self.row["create_s"] = time.time() - applied
        poll.until(
            "every job Running",
            lambda: self.clock and self.clock.all_running(self.names()),
            timeout=self.args.wait_seconds,
            every=0.5,
            diagnosis=self._context,
        )
        done = self.clock.last_running(self.names())
        cpu = cpu_seconds(self.op.proc.pid) - cpu0
        self.row["cpu_pct_bring_up"] = 100.0 * cpu / (time.monotonic() - t0)
        self.row |= api_window(before, self._scrape(), time.time() - applied, "bring_up")
        lags = self.clock.job_lags(self.names())
        self.row |= {
            "apply_to_all_running_s": done - applied,
            "apply_to_all_pods_running_s": self.clock.last_pod_running() - applied,
            "job_lag_p50_s": pct(lags, 0.5),
            "job_lag_p95_s": pct(lags, 0.95),
            "job_lag_max_s": max(lags) if lags else None,
        }

    def _settle_and_steady(self) -> None:
        assert self.op.proc is not None
        pid, window = self.op.proc.pid, self.args.steady_seconds
        time.sleep(self.args.settle_seconds)
        rss = rss_kib(pid)
        self.row |= {
            "rss_jobs_kib": rss,
            "kib_per_job": (rss - self.row["rss_idle_kib"]) / self.jobs,
        }
        if report := self._heap_report(2):
            kept = self.args.out.with_name(f"fleet-heap-{self.jobs}.txt")
            kept.write_text(report)
            self.row["heap_report"] = kept.name
        before, cpu0, t0 = self._scrape(), cpu_seconds(pid), time.monotonic()
        time.sleep(window)
        after, cpu1, elapsed = self._scrape(), cpu_seconds(pid), time.monotonic() - t0
        self.row["rss_jobs_metric_bytes"] = total(after, "process_resident_memory_bytes")
        self.row |= api_window(before, after, elapsed, "steady")
        self.row |= {"steady_s": elapsed, "cpu_pct": 100.0 * (cpu1 - cpu0) / elapsed}

    def _failures(self) -> None:
        assert self.clock is not None
        count = min(self.args.failures, self.jobs)
        victims = random.Random(self.args.seed).sample(self.names(), count)
        before, started = self._scrape(), time.time()
        for job in victims:
            self.fleet.fail_pod(self.ns, names.pod_name(job, attempt=1, node_rank=0), exit_code=1)
            time.sleep(self.args.failure_spacing)
        poll.until(
            "replacement attempts Running",
            lambda: self.clock and all(self.clock.job_running(j, 2) for j in victims),
            timeout=self.args.wait_seconds,
            every=0.5,
            diagnosis=self._context,
        )
        self.row |= api_window(before, self._scrape(), time.time() - started, "failures")
        replaced = [self.clock.replaced_after(j, attempt=1) for j in victims]
        recovered = [self.clock.recovered_after(j, attempt=1) for j in victims]
        got = [r for r in replaced if r is not None]
        back = [r for r in recovered if r is not None]
        self.row |= {
            "failures": count,
            "replace_p50_s": pct(got, 0.5),
            "replace_p95_s": pct(got, 0.95),
            "replace_max_s": max(got) if got else None,
            "failed_to_running_p95_s": pct(back, 0.95),
            "replace_samples": got,
        }

    def _restart(self) -> None:
        """Pass throughput: a fresh operator (as after a failover) must look at every job. Time
        from its first pass until it has made one per job; its RSS once they are done."""
        self.op.stop()
        self.op.start()
        poll.until(
            "operator metrics",
            lambda: self._try_scrape() is not None,
            timeout=120,
            diagnosis=self.op.log_tail,
        )
        seen: list[tuple[float, float]] = []

        def passes() -> float:
            got = total(self._scrape(), "fsdpjob_reconcile_passes_total") or 0.0
            seen.append((time.time(), got))
            return got

        poll.until(
            "a pass per job",
            lambda: passes() >= self.jobs,
            timeout=self.args.wait_seconds,
            every=0.1,
            diagnosis=self._context,
        )
        first = next(t for t, n in seen if n > 0)
        done = seen[-1][0]
        self.row |= {
            "restart_passes": seen[-1][1],
            "restart_all_passed_s": done - first,
            "restart_passes_per_s": seen[-1][1] / max(done - first, 1e-3),
        }

    def _context(self) -> str:
        summary = self.clock.summary(self.names()) if self.clock else ""
        return f"{summary}\n--- operator log ---\n{self.op.log_tail(30)}"

    def _clean_up(self) -> None:
        """Jobs deleted while the operator runs (it sees them go), then the operator, then the
        namespace, each gone before the next size starts. Records how long the deletion took
        and the operator's CPU meanwhile (its pods' events and the passes that find a job gone)."""

        def op_cpu() -> float | None:  # None: no operator running (it failed, or never began)
            with contextlib.suppress(OSError):
                return cpu_seconds(self.op.proc.pid) if self.op.proc is not None else None
            return None

        cpu0, t0 = op_cpu(), time.monotonic()
        self.cluster.kubectl(
            "delete", "fsdpjobs", "--all", "-n", self.ns, "--wait=false", check=False, timeout=600
        )
        with contextlib.suppress(AssertionError):
            poll.until("jobs and pods gone", lambda: not self._left(), timeout=600, every=1.0)
            elapsed = time.monotonic() - t0
            self.row["delete_all_gone_s"] = elapsed
            cpu1 = op_cpu()
            if cpu0 is not None and cpu1 is not None:
                self.row["cpu_pct_delete"] = 100.0 * (cpu1 - cpu0) / elapsed
        self.op.stop()
        self.cluster.kubectl(
            "delete", "namespace", self.ns, "--timeout=300s", check=False, timeout=330
        )

    def _left(self) -> int:
        jobs = self.kube.get(f"{GROUP_PATH}/namespaces/{self.ns}/fsdpjobs", limit=1)["items"]
        pods = self.kube.get(f"/api/v1/namespaces/{self.ns}/pods", limit=1)["items"]
        return len(jobs) + len(pods)


@contextlib.contextmanager
def _pool() -> Any:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        yield pool


# --- results ----------------------------------------------------------------------------------
def provenance(args: argparse.Namespace) -> dict[str, Any]:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "operator"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    mem = Path("/proc/meminfo").read_text().split()[1]
    return {
        "machine": f"{os.cpu_count()} cores, {int(mem) // 2**20} GiB; control plane + kwok "
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs; operator as a host process",
        "operator_tree": head + (" + uncommitted operator/ changes" if dirty else ""),
        "config": {k: v for k, v in vars(args).items() if k not in {"replot", "out", "plot"}},
        "goals": GOALS,
        "sizes": [],
    }


def print_table(result: dict[str, Any]) -> None:
    cols = [
        ("jobs", "jobs", "{:.0f}"),
        ("->Running s", "apply_to_all_running_s", "{:.1f}"),
        ("lag p95", "job_lag_p95_s", "{:.2f}"),
        ("lag max", "job_lag_max_s", "{:.2f}"),
        ("passes/s", "passes_per_s_bring_up", "{:.1f}"),
        ("max pass/s", "restart_passes_per_s", "{:.1f}"),
        ("idle MiB", "rss_idle_kib", "{}"),
        ("KiB/job", "kib_per_job", "{:.1f}"),
        ("CPU %", "cpu_pct", "{:.1f}"),
        ("LIST/pass", "list_per_pass_steady", "{:.3f}"),
        ("repl p50", "replace_p50_s", "{:.2f}"),
        ("repl p95", "replace_p95_s", "{:.2f}"),
        ("x base up", "ratio_all_running", "{:.2f}"),
        ("x base repl", "ratio_replace_p95", "{:.2f}"),
    ]
    print(" | ".join(f"{title:>11}" for title, _, _ in cols))
    for row in result["sizes"]:
        cells = []
        for _, key, fmt in cols:
            value = row.get(key)
            if key == "rss_idle_kib" and value is not None:
                value = f"{value / 1024:.0f}"
            cells.append("null" if value is None else fmt.format(value))
        print(" | ".join(f"{c:>11}" for c in cells))
    for row in result["sizes"]:
        api = row.get("api_per_s_by_resource_steady")
        shown = {k: round(v, 2) for k, v in api.items() if v} if api else None
        print(f"jobs={row['jobs']}: operator API requests/s, steady: {shown}")


def write(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out)


# --- main -------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", default="100,1000", help="job counts, comma-separated")
    p.add_argument("--pods-per-job", type=int, default=4)
    p.add_argument("--gpus-per-pod", type=int, default=1)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="8, as GPU servers come: at 4, 1,000 jobs of 4 pods fill every GPU, and with one pod "
        "of a job per node the last job's last pod may find no node left (it happened)",
    )
    p.add_argument("--failures", type=int, default=50)
    p.add_argument("--failure-spacing", type=float, default=0.2, help="seconds between failures")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="operator idle before RSS")
    p.add_argument("--settle-seconds", type=float, default=30.0)
    p.add_argument("--steady-seconds", type=float, default=60.0)
    p.add_argument("--wait-seconds", type=float, default=1800.0, help="limit of each wait")
    p.add_argument(
        "--node-grace",
        type=int,
        default=300,
        help="controller-manager node-monitor grace (s); kwok renews leases 4x in it. At 40 s a "
        "2-core machine bringing up 4,000 pods starved kwok: 173 of 1,000 fake nodes went "
        "NotReady and their jobs (rightly) restarted",
    )
    p.add_argument(
        "--heap-report",
        action="store_true",
        help="have the operator write a heap report idle and with the jobs settled "
        "(fsdp_operator/io/heap.py) and keep the second as bench/results/fleet-heap-<jobs>.txt; "
        "taken after each RSS is read, but its walk of every object raises the operator's peak",
    )
    p.add_argument(
        "--heap-frames",
        type=int,
        default=0,
        help="with --heap-report, also trace allocations with this many frames "
        "(FSDPOP_HEAP_FRAMES); several times slower: for a few hundred jobs, not 1,000",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the plain ReplicaSets baseline (bench/fleet_baseline.py) each size runs first",
    )
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--plot", type=Path, default=PLOT)
    p.add_argument("--replot", action="store_true", help="only redraw the plot from --out")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the other job counts already in --out (measure one size again)",
    )
    args = p.parse_args()
    args.jobs = sorted(int(n) for n in str(args.jobs).split(","))
    need = max(args.jobs) * args.pods_per_job * args.gpus_per_pod
    if need > args.nodes * args.gpus_per_node or args.pods_per_job > args.nodes:
        p.error(
            f"{max(args.jobs)} jobs x {args.pods_per_job} pods x {args.gpus_per_pod} GPUs "
            f"need {need} GPUs on >= {args.pods_per_job} nodes; the fleet has "
            f"{args.nodes} x {args.gpus_per_node}"
        )
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    result = provenance(args)
    if args.keep and args.out.exists():
        kept = json.loads(args.out.read_text()).get("sizes", [])
        result["kept_from_earlier_run"] = sorted(
            r["jobs"] for r in kept if r["jobs"] not in args.jobs
        )
        result["sizes"] = [r for r in kept if r["jobs"] not in args.jobs]
    # kwok renews a lease every quarter of its duration; at the local control plane's 8 s grace
    # a thousand nodes would write 500 leases a second; at 300 s, 13 (and a busy kwok renewing
    # late does not turn fake nodes NotReady: that would measure the harness, not the operator).
    if not hasattr(components, "NODE_MONITOR_GRACE"):  # renamed: 40 s leases would lapse
        raise SystemExit(
            "localcluster.components.NODE_MONITOR_GRACE is gone; update bench/fleet.py"
        )
    components.NODE_MONITOR_GRACE = f"{args.node_grace}s"
    options = kwok.FleetOptions(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, lease_seconds=args.node_grace
    )
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        if args.heap_report:  # the operator processes inherit the environment
            os.environ["FSDPOP_HEAP_FRAMES"] = str(args.heap_frames)
        cluster = controlplane.Cluster.up(
            Path(tmp) / "cluster", nodes=controlplane.NodeOptions(nodes=0)
        )
        try:
            with kwok.Fleet(cluster, options) as fleet:
                print(f"{len(fleet.ready_nodes())} fake nodes Ready", flush=True)
                stack.install_crd(cluster)
                kubeconfig = stack.install_rbac(cluster)
                for jobs in args.jobs:
                    size = Size(
                        fleet=fleet, kubeconfig=kubeconfig, log_dir=Path(tmp), args=args, jobs=jobs
                    )
                    result["sizes"].append(size.run())
                    result["sizes"].sort(key=lambda r: r["jobs"])
                    write(result, args.out)
                    print_table(result)
        finally:
            cluster.down()
    return result


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    args = parse_args()
    if not args.replot:
        # SIGTERM unwinds like Ctrl-C, so every finally stops what it started.
        signal.signal(signal.SIGTERM, _interrupt)
        run(args)
    fleet_plot.plot(json.loads(args.out.read_text()), args.plot)
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
