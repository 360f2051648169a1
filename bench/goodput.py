"""Soak benchmark: goodput under a Poisson fault process, `intervalSteps: auto` against fixed
intervals of 1/4x, 1x and 4x the Young/Daly optimum.

Starts its own local cluster (control plane, kubelet nodes, the worker image) and the operator,
and runs the real worker: examples/tiny-cpu.yaml's FSDP2 job (2 pods x 2 CPU ranks, gloo, DCP
saves) with a long step budget. Each configuration runs until `--failures` faults have been
injected. Faults come from a seeded Poisson process on the job's *training* time: after the job
is training again (its first step after resuming), the next fault waits Exp(--mtbf) seconds.
Every configuration sees the same draws (common random numbers), so the comparison between
intervals is not drowned in the fault process's own noise; `--repeat` reruns the 1x interval
with the same draws to measure what is left (run-to-run noise), and `--reseed` once with other
draws (the fault process's noise).

Kinds (`--faults`): crash (SIGKILL of one training rank), hang (SIGSTOP of one pod's
processes: caught by progressDeadlineSeconds), node (the kubelet of a node hosting a pod stops:
NodeLost; the node is restored once the job trains again), or mixed (each drawn at random).

Order: `auto` runs first; its workers' measured save and step costs fix the optimum N* that the
fixed configurations use (N*/4, N*, 4 N*). The model is Daly's (interval.model_goodput) with
the measured blocking save cost, the mean measured time to resume, and the injected MTBF.
Goodput is the operator's own figure (status.goodput), also shown without the first start-up
(the model has none). Writes bench/results/goodput.json and a plot (docs/goodput.png).
Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fsdp_operator import status as st
from fsdp_worker import interval
from harness import stack
from localcluster import controlplane, images
from localcluster import faults as lf

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "goodput.json"
PLOT = ROOT / "docs" / "goodput.png"
NS = "goodput"
KINDS = ("crash", "hang", "node")


def job_doc(name: str, *, every: int | str, prior: float) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["image"] = images.WORKER
    spec["training"]["steps"] = 10_000_000  # never finishes: the soak stops it
    spec["training"]["scheduler"] = {"kind": "constant", "warmupSteps": 10}
    spec["checkpoint"].update(
        intervalSteps=every, keep=2,
        autoInterval={"minSteps": 5, "maxSteps": 100_000, "priorMtbfSeconds": prior},
    )  # fmt: skip
    spec["failurePolicy"] = {
        "maxRestarts": 1000, "maxInfraRestarts": 1000, "maxRestartsWithoutProgress": 1000,
        "backoff": {"initialSeconds": 1, "maxSeconds": 2},
        "nodeLossGraceSeconds": 4, "progressDeadlineSeconds": 10, "pendingTimeoutSeconds": 120,
    }  # fmt: skip
    return doc


@dataclasses.dataclass
class Run:
    label: str
    every: int | str
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    status: dict[str, Any] = dataclasses.field(default_factory=dict)
    interval_samples: list[int] = dataclasses.field(default_factory=list)
    wall: float = 0.0

    def summary(self, step_seconds: float) -> dict[str, Any]:
        s = self.status
        g = s.get("goodput") or {}
        lost = g.get("lostSeconds") or {}
        wall = g.get("wallSeconds") or 0.0
        steady = wall - lost.get("Startup", 0.0)
        resumes = []
        for h in s.get("history") or []:
            tl = st.Timeline.model_validate(h["timeline"]) if h.get("timeline") else None
            if tl is not None and tl.failed is not None and tl.first_step is not None:
                resumes.append({"cause": tl.cause.value if tl.cause else None,
                                "seconds": st.time_to_resume(tl),
                                "phases": dict(st.breakdown(tl))})  # fmt: skip
        steps = statistics.mean(self.interval_samples) if self.interval_samples else None
        return {
            "label": self.label, "intervalSteps": self.every,
            "meanIntervalSteps": steps,
            "intervalSeconds": steps * step_seconds if steps else None,
            "failures": len(self.faults), "faults": self.faults,
            "goodput": g.get("fraction"),
            "goodputSteady": round(g.get("productiveSeconds", 0.0) / steady, 4) if steady else None,
            "wallSeconds": wall, "lostSeconds": lost, "redoneSeconds": g.get("redoneSeconds"),
            "resumes": resumes, "checkpointInterval": s.get("checkpointInterval"),
            "reliability": s.get("reliability"),
        }  # fmt: skip


class Soak:
    def __init__(self, cluster: controlplane.Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.jobs = stack.Jobs(cluster, NS)
        self.faults = lf.Faults.for_cluster(cluster.state_dir)

    def status(self, name: str) -> dict[str, Any]:
        return self.jobs.status(name)

    def training_again(self, name: str, after_attempt: int) -> dict[str, Any]:
        """Wait until an attempt later than `after_attempt` completed its first step."""

        def ready() -> dict[str, Any] | None:
            s = self.status(name)
            hist = s.get("history") or []
            last = hist[-1] if hist else {}
            started = (last.get("timeline") or {}).get("firstStep") is not None
            fresh = s.get("attempt", 0) > after_attempt and s.get("phase") == "Running"
            return s if fresh and started and last.get("attempt") == s["attempt"] else None

        return stack.wait_for(f"{name}: training again", ready, timeout=300, every=0.5)

    def inject(self, name: str, kind: str, rng: random.Random) -> dict[str, Any]:
        pods = self.jobs.running_pods(name, self.status(name)["attempt"])
        pod = rng.choice(pods)
        pname, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        if kind == "crash":
            ranks = int(pod["metadata"]["labels"]["fsdpoperator.io/node-rank"])
            per = int(pod["metadata"]["labels"]["fsdpoperator.io/world-size"]) // len(pods)
            rank = ranks * per + rng.randrange(per)
            self.faults.kill_rank(NS, pname, rank=rank)
            return {"kind": kind, "pod": pname, "rank": rank, "time": time.time()}
        if kind == "hang":
            self.faults.freeze(NS, pname)
            return {"kind": kind, "pod": pname, "time": time.time()}
        self.faults.lose_node(node)
        return {"kind": kind, "pod": pname, "node": node, "time": time.time()}

    def run(self, label: str, every: int | str, seed: int) -> Run:
        name = "soak-" + re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        rng = random.Random(seed)
        draws = [rng.expovariate(1.0 / self.args.mtbf) for _ in range(self.args.failures)]
        picks = [rng.choice(KINDS) if self.args.faults == "mixed" else self.args.faults
                 for _ in range(self.args.failures)]  # fmt: skip
        chooser = random.Random(seed + 1)  # which pod / rank: same sequence for every config
        prior = self.args.prior_factor * self.args.mtbf
        self.jobs.apply(job_doc(name, every=every, prior=prior))
        run = Run(label, every)
        started = time.time()
        s = self.training_again(name, 0)
        try:
            for i, (wait, kind) in enumerate(zip(draws, picks, strict=True)):
                until = time.time() + wait
                while time.time() < until:
                    ci = (self.status(name).get("checkpointInterval") or {}).get("steps")
                    if ci:
                        run.interval_samples.append(int(ci))
                    time.sleep(min(1.0, max(0.0, until - time.time())))
                attempt = self.status(name)["attempt"]
                fault = self.inject(name, kind, chooser)
                s = self.training_again(name, attempt)
                if kind == "node":
                    self.faults.restore_node(fault["node"])
                fault["resumedAttempt"] = s["attempt"]
                run.faults.append(fault)
                print(f"  {label}: fault {i + 1}/{len(draws)} {kind} after {wait:.1f}s; "
                      f"training again in attempt {s['attempt']}", flush=True)  # fmt: skip
            time.sleep(2.0)  # a last scrape of the attempt that is training now
            run.status = self.status(name)
        finally:
            run.wall = time.time() - started
            self.cluster.kubectl("delete", "fsdpjob", name, "-n", NS, "--wait=true",
                                 "--timeout=120s", check=False)  # fmt: skip
            for node in {f["node"] for f in run.faults if f.get("node")}:
                self.faults.restore_node(node)
            stack.wait_for("pods gone", lambda: not self.jobs.pods(name), timeout=120)
        return run


def _costs(run: Run) -> tuple[float, float]:
    """(blocking save seconds, step seconds) the auto run's workers measured."""
    ci = run.status.get("checkpointInterval") or {}
    hist = [
        h for h in run.status.get("history") or [] if h.get("stepsRun") and h.get("trainSeconds")
    ]
    step = sum(h["trainSeconds"] for h in hist) / max(1, sum(h["stepsRun"] for h in hist))
    return float(ci.get("saveSeconds") or 0.0), float(ci.get("stepSeconds") or step)


def _model(tau: float, m: dict[str, Any]) -> float:
    """Faults strike only while the job trains (they are drawn on its uptime)."""
    return interval.model_goodput(
        interval_seconds=tau, save_seconds=m["saveSeconds"], restart_seconds=m["restartSeconds"],
        mtbf_seconds=m["mtbfSeconds"], fail_while_restarting=False,
    )  # fmt: skip


def analyse(result: dict[str, Any]) -> None:
    """The model from the runs' measured costs, and each run's predicted goodput."""
    m = result["model"]
    resumes = [x["seconds"] for r in result["runs"] for x in r["resumes"] if x["seconds"]]
    m["restartSeconds"] = statistics.mean(resumes) if resumes else 0.0
    m["optimumGoodput"] = _model(m["optimumSeconds"], m)
    for r in result["runs"]:
        if r["intervalSeconds"]:
            r["modelGoodput"] = _model(r["intervalSeconds"], m)


def report(result: dict[str, Any]) -> None:
    m = result["model"]
    print(f"\nmodel: save {m['saveSeconds']:.3f}s, restart {m['restartSeconds']:.1f}s, MTBF "
          f"{m['mtbfSeconds']:g}s -> optimum {m['optimumSeconds']:.1f}s, goodput "
          f"{100 * m['optimumGoodput']:.1f}%")  # fmt: skip
    print(f"{'run':<16}{'interval':>10}{'seconds':>9}{'goodput':>9}{'steady':>8}{'model':>8}")
    for r in result["runs"]:
        secs = r["intervalSeconds"] or 0.0
        print(f"{r['label']:<16}{r['meanIntervalSteps'] or 0:>10.0f}{secs:>9.1f}"
              f"{100 * (r['goodput'] or 0):>8.1f}%{100 * (r['goodputSteady'] or 0):>7.1f}%"
              f"{100 * r.get('modelGoodput', 0):>7.1f}%")  # fmt: skip


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result["model"]
    lo, hi = m["optimumSeconds"] / 16, m["optimumSeconds"] * 16
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ys = [_model(x, m) for x in xs]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [100 * y for y in ys], color="0.3", label="Daly model (measured save, restart)")
    ax.axvline(m["optimumSeconds"], color="0.6", ls=":", lw=1)
    for r in result["runs"]:
        if r["intervalSeconds"] is None or r["goodputSteady"] is None:
            continue
        auto = r["intervalSteps"] == "auto"
        ax.scatter([r["intervalSeconds"]], [100 * r["goodputSteady"]], s=70 if auto else 40,
                   marker="*" if auto else "o", zorder=3,
                   color="tab:red" if auto else "tab:blue",
                   label=f"{r['label']} (measured)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("compute between checkpoints (s, log)")
    ax.set_ylabel("goodput (%), start-up excluded")
    ax.set_title(f"goodput vs checkpoint interval: MTBF {m['mtbfSeconds']:.0f}s, "
                 f"{result['args']['faults']} faults")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtbf", type=float, default=40.0, help="mean training seconds per fault")
    parser.add_argument("--failures", type=int, default=10, help="faults per configuration")
    parser.add_argument("--faults", choices=[*KINDS, "mixed"], default="mixed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--factors", default="0.25,1,4", help="fixed intervals, x the optimum")
    parser.add_argument("--repeat", type=int, default=1, help="extra 1x runs, same draws")
    parser.add_argument("--reseed", type=int, default=1, help="extra 1x runs, other draws")
    parser.add_argument("--prior-factor", type=float, default=2.0,
                        help="autoInterval.priorMtbfSeconds as a multiple of --mtbf")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--replot", type=Path, help="only re-analyse and re-plot this result")
    args = parser.parse_args(argv)
    if args.replot:
        result = json.loads(args.replot.read_text())
        analyse(result)
        args.replot.write_text(json.dumps(result, indent=1))
        plot(result, args.plot)
        report(result)
        return 0
    began = time.time()
    state = Path(tempfile.mkdtemp(prefix="fsdp-goodput-"))
    images.build(images.TEST_TARGETS)
    cluster = controlplane.Cluster.up(
        state / "cluster", nodes=controlplane.NodeOptions(args.nodes, images=(images.WORKER,))
    )
    op = None
    try:
        stack.install_crd(cluster)
        op = stack.Operator(
            cluster, stack.install_rbac(cluster), state, worker_module="fsdp_worker"
        )
        op.start()
        cluster.kubectl("create", "namespace", NS)
        soak = Soak(cluster, args)
        soak.jobs.ensure_pvc()
        print(f"auto (prior MTBF {args.prior_factor:g}x the injected {args.mtbf:g}s)", flush=True)
        runs = [soak.run("auto", "auto", args.seed)]
        save_s, step_s = _costs(runs[0])
        optimum = interval.daly_interval_seconds(save_s, args.mtbf)
        best = max(1, round(optimum / step_s))
        print(f"measured: save {save_s:.3f}s, step {step_s:.4f}s -> optimum {optimum:.1f}s "
              f"= {best} steps", flush=True)  # fmt: skip
        plan = [(f"{f}x", max(1, round(best * float(f))), args.seed)
                for f in args.factors.split(",")]  # fmt: skip
        plan += [(f"1x repeat {i + 1}", best, args.seed) for i in range(args.repeat)]
        plan += [(f"1x seed {args.seed + 100 + i}", best, args.seed + 100 + i)
                 for i in range(args.reseed)]  # fmt: skip
        model = {"saveSeconds": save_s, "stepSeconds": step_s, "mtbfSeconds": args.mtbf,
                 "optimumSeconds": optimum, "optimumSteps": best}  # fmt: skip
        result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                                  "model": model}  # fmt: skip

        def save() -> None:  # after every run: a failure later loses nothing complete
            result["runs"] = [r.summary(step_s) for r in runs]
            result["benchSeconds"] = round(time.time() - began, 1)
            analyse(result)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
            plot(result, args.plot)

        save()
        for label, every, seed in plan:
            print(f"{label}: every {every} steps", flush=True)
            runs.append(soak.run(label, every, seed))
            save()
        report(result)
        print(f"wrote {args.out} and {args.plot} in {result['benchSeconds']:.0f}s")
        return 0
    finally:
        if op is not None:
            op.stop()
        cluster.down()


if __name__ == "__main__":
    raise SystemExit(main())
