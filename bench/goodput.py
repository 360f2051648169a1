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

`--in-place` measures restarts in place instead: the same fault draws twice in one run, first
"recreate" (failurePolicy.inPlaceRestarts 0: every failure recreates the gang), then "in-place"
(inPlaceRestarts at its maximum, so no budget ends it, and `checkpoint.memory: {intervalSteps:
auto, sizeLimit: 512Mi}`); both with intervalSteps auto and the soak's other settings. A crash
then restarts the ranks inside the same pods (status.attempt stays; the attempt's history entry
gains a `restartsInPlace` item whose `resumed` is the next first step); a hang (SIGSTOP of a
whole pod, its keeper too) and a lost node still recreate the gang. Time to resume: an in-place
restart's `resumed - failure.time`, a recreated gang's history timeline (failed -> firstStep);
both per cause, with each fault's own injection -> next first step beside them. Writes
bench/results/goodput_in_place.json and docs/goodput_in_place.png:

    PYTHONPATH=. python bench/goodput.py --in-place --failures 8

(`make bench-goodput GOODPUT_ARGS="--in-place --failures 8"` runs the same.) `--spares 1` adds a
third run, "spares": in place as the second, with `spec.spares: 1` on the node the gang leaves
free: a lost node other than node rank 0's, or a frozen pod other than node rank 0's (its keeper
falls silent), is given to the spare instead of recreating the gang.

`--memory-factors 0.25,1,4` then sweeps the memory tier's interval: the last of those runs
again with `checkpoint.memory.intervalSteps` fixed at those multiples of Daly's optimum for the
memory save's measured cost (status.memoryTier, sampled each second; the claim stays auto), and
reports how far `auto` is from the model's optimum and the best fixed run
(`memorySweep` in the JSON, `<plot>_memory.png`). `--no-baselines` skips the recreate and
plain in-place runs when `--spares` is given:

    PYTHONPATH=. python bench/goodput.py --in-place --spares 1 --failures 12 --no-baselines \
        --memory-factors 0.25,1,4 --out bench/results/goodput_memory_sweep.json \
        --plot docs/goodput_memory_sweep.png

`--object-store` (with `--in-place`) runs the last configuration once more with its
checkpoints in the local cluster's S3 server (versitygw, a bucket and a keys Secret of its own)
instead of the claim, on the same draws: the two goodputs side by side (issue 45).

`--no-build` uses the images as podman holds them now instead of building them first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fsdp_operator.types import names
from fsdp_operator.types import status as st
from fsdp_worker.contract import interval
from harness import stack
from localcluster import controlplane, images, objectstore, poll
from localcluster import faults as lf

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "goodput.json"
PLOT = ROOT / "docs" / "goodput.png"
OUT_IN_PLACE = ROOT / "bench" / "results" / "goodput_in_place.json"
PLOT_IN_PLACE = ROOT / "docs" / "goodput_in_place.png"
NS = "goodput"
KINDS = ("crash", "hang", "node")
IN_PLACE_RESTARTS = 100  # the API's maximum (status.IN_PLACE_LIMIT): no budget ends the soak
MEMORY_TIER = {"intervalSteps": "auto", "sizeLimit": "512Mi"}
S3_BUCKET, S3_SECRET = "soak", "soak-s3-keys"  # --object-store: the bucket and its keys' Secret
EXPECTED_CAUSE = {"crash": "Crash", "hang": "Hang", "node": "NodeLost"}
SPARE_LABEL = "fsdpoperator.io/spare"


def job_doc(
    name: str,
    *,
    every: int | str,
    prior: float,
    in_place: bool = False,
    spares: int = 0,
    memory_every: int | str = "auto",
    store: objectstore.ObjectStore | None = None,
) -> dict[str, Any]:
    """examples/tiny-cpu.yaml as the soak runs it; with `store`, its checkpoints in that S3
    server's bucket S3_BUCKET (keys in the Secret S3_SECRET) instead of the claim."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["image"] = images.WORKER
    spec["training"]["steps"] = 10_000_000  # never finishes: the soak stops it
    spec["training"]["scheduler"] = {"kind": "constant", "warmupSteps": 10}
    spec["checkpoint"].update(
        intervalSteps=every,
        keep=2,
        autoInterval={"minSteps": 5, "maxSteps": 100_000, "priorMtbfSeconds": prior},
    )
    spec["failurePolicy"] = {
        "maxRestarts": 1000,
        "maxInfraRestarts": 1000,
        "maxRestartsWithoutProgress": 1000,
        "backoff": {"initialSeconds": 1, "maxSeconds": 2},
        "nodeLossGraceSeconds": 4,
        "progressDeadlineSeconds": 10,
        "pendingTimeoutSeconds": 120,
    }
    if in_place:
        spec["failurePolicy"]["inPlaceRestarts"] = IN_PLACE_RESTARTS
        spec["checkpoint"]["memory"] = {**MEMORY_TIER, "intervalSteps": memory_every}
    if spares:
        spec["spares"] = spares
    if store is not None:
        spec["checkpoint"].pop("claimName")
        spec["checkpoint"]["objectStore"] = {
            "bucket": S3_BUCKET,
            "prefix": "soak",
            "endpoint": store.cluster_endpoint,
            "region": store.region,
            "credentialsSecret": S3_SECRET,
        }
    return doc


def crd_without_memory_default(cluster: controlplane.Cluster, state: Path) -> list[str]:
    """Where crds/fsdpjobs.yaml defaults `checkpoint.memory` (fae9f08: crd._default_objects
    gives the optional tier a default, so the API server turns it on in every job that has a
    checkpoint, and the CEL rule then rejects every job with inPlaceRestarts 0), apply the same
    CRD without that default: unset stays unset, as api.CheckpointConfig means. Returns what it
    removed (nothing once the CRD is fixed); the result JSON records it."""
    doc = yaml.safe_load((ROOT / "crds" / "fsdpjobs.yaml").read_text())
    removed = []
    for version in doc["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ckpt = spec["properties"]["checkpoint"]
        if ckpt["properties"].get("memory", {}).pop("default", None) is not None:
            removed.append(f"{version['name']}: spec.checkpoint.properties.memory.default")
        if (ckpt.get("default") or {}).pop("memory", None) is not None:
            removed.append(f"{version['name']}: spec.checkpoint.default.memory")
    if not removed:
        return removed
    path = state / "fsdpjobs-memory-unset.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cluster.kubectl("apply", "--server-side", "-f", str(path))
    probe = json.dumps(job_doc("crd-probe", every="auto", prior=80.0))

    def accepted() -> bool:
        done = cluster.kubectl(
            "apply", "-n", NS, "--dry-run=server", "-f", "-", input=probe, check=False
        )
        return done.returncode == 0

    poll.until("a job with inPlaceRestarts 0 admitted", accepted, timeout=60, every=1.0)
    print(f"CRD: removed the default of checkpoint.memory ({'; '.join(removed)})", flush=True)
    return removed


def _in_place_keys(s: dict[str, Any]) -> set[tuple[int, int]]:
    """(attempt, generation) of every restart in place the status holds."""
    return {
        (int(h.get("attempt", 0)), int(r["generation"]))
        for h in s.get("history") or []
        for r in h.get("restartsInPlace") or []
    }


def _new_in_place(s: dict[str, Any], seen: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """Restarts in place not in `seen`, oldest first, each with its attempt."""
    return [
        {**r, "attempt": int(h.get("attempt", 0))}
        for h in s.get("history") or []
        for r in h.get("restartsInPlace") or []
        if (int(h.get("attempt", 0)), int(r["generation"])) not in seen
    ]


def _entry(s: dict[str, Any], attempt: int) -> dict[str, Any]:
    return next((h for h in s.get("history") or [] if h.get("attempt") == attempt), {})


def in_place_resumes(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every restart in place the history holds: resumed - failure.time, and where from."""
    out = []
    for h in history:
        for raw in h.get("restartsInPlace") or []:
            r = st.InPlaceRestart.model_validate(raw)
            seconds = r.resumed - r.failure.time if r.resumed is not None else None
            out.append(
                {
                    "cause": r.failure.cause.value,
                    "how": "inPlace",
                    "seconds": seconds,
                    "attempt": h.get("attempt"),
                    "generation": r.generation,
                    "fromMemory": r.from_memory,
                    "resumedFromStep": r.resumed_from_step,
                    "stepsLost": r.steps_lost,
                    "failedAtStep": r.failure.step,
                }
            )
    return out


def by_cause(resumes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cause (and per cause and how: inPlace or recreated): n, p50, mean, max seconds."""
    groups: dict[str, list[float]] = {}
    for x in resumes:
        if x.get("seconds") is None:
            continue
        for key in (str(x["cause"]), f"{x['cause']} ({x.get('how', 'recreated')})"):
            groups.setdefault(key, []).append(float(x["seconds"]))
    return {
        k: {
            "n": len(v),
            "p50": round(statistics.median(v), 2),
            "mean": round(statistics.mean(v), 2),
            "max": round(max(v), 2),
        }
        for k, v in sorted(groups.items())
    }


@dataclasses.dataclass
class Run:
    label: str
    every: int | str
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    status: dict[str, Any] = dataclasses.field(default_factory=dict)
    interval_samples: list[int] = dataclasses.field(default_factory=list)
    wall: float = 0.0
    in_place: bool = False
    spares: int = 0
    memory_every: int | str = "auto"  # checkpoint.memory.intervalSteps (in place)
    memory_samples: list[int] = dataclasses.field(default_factory=list)  # its steps, each second
    memory_saves: list[float] = dataclasses.field(default_factory=list)  # its last save's seconds
    history: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Every attempt's history entry as last seen: status keeps only the newest 20, and a
    fault that cost a cascade of restarts pushes earlier ones out before the run ends."""

    def remember(self, s: dict[str, Any]) -> None:
        for h in s.get("history") or []:
            self.history[int(h.get("attempt", 0))] = h

    def all_history(self) -> list[dict[str, Any]]:
        self.remember(self.status)
        return [self.history[a] for a in sorted(self.history)]

    def summary(self, step_seconds: float) -> dict[str, Any]:
        s = self.status
        g = s.get("goodput") or {}
        lost = g.get("lostSeconds") or {}
        wall = g.get("wallSeconds") or 0.0
        steady = wall - lost.get("Startup", 0.0)
        resumes = []
        history = self.all_history()
        for h in history:
            tl = st.Timeline.model_validate(h["timeline"]) if h.get("timeline") else None
            if tl is not None and tl.failed is not None and tl.first_step is not None:
                resumes.append(
                    {
                        "cause": tl.cause.value if tl.cause else None,
                        "seconds": st.time_to_resume(tl),
                        "phases": dict(st.breakdown(tl)),
                        "attempt": h.get("attempt"),
                    }
                )
        steps = statistics.mean(self.interval_samples) if self.interval_samples else None
        mem = statistics.mean(self.memory_samples) if self.memory_samples else None
        if self.in_place or any(h.get("restartsInPlace") for h in history):
            for x in resumes:
                x["how"] = "recreated"
            resumes += in_place_resumes(history)
        return {
            "label": self.label,
            "intervalSteps": self.every,
            "meanIntervalSteps": steps,
            "intervalSeconds": steps * step_seconds if steps else None,
            "failures": len(self.faults),
            "faults": self.faults,
            "goodput": g.get("fraction"),
            "goodputSteady": round(g.get("productiveSeconds", 0.0) / steady, 4) if steady else None,
            "wallSeconds": wall,
            "lostSeconds": lost,
            "redoneSeconds": g.get("redoneSeconds"),
            "resumes": resumes,
            "checkpointInterval": s.get("checkpointInterval"),
            "reliability": s.get("reliability"),
            "memoryIntervalSteps": self.memory_every if self.in_place else None,
            "meanMemoryIntervalSteps": mem,
            "memoryIntervalSeconds": mem * step_seconds if mem else None,
            "memorySaveSeconds": (
                statistics.median(self.memory_saves) if self.memory_saves else None
            ),
        }


class Soak:
    def __init__(self, cluster: controlplane.Cluster, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.jobs = stack.Jobs(cluster, NS)
        self.faults = lf.Faults.for_cluster(cluster.state_dir)

    def status(self, name: str) -> dict[str, Any]:
        return self.jobs.status(name)

    def training_again(
        self, name: str, after_attempt: int, seen: set[tuple[int, int]] | None = None
    ) -> dict[str, Any]:
        """Wait until an attempt later than `after_attempt` completed its first step, or (with
        `seen`: the restarts in place known before the fault) a restart in place not in `seen`
        trained again (its `resumed` is set)."""

        def ready() -> dict[str, Any] | None:
            s = self.status(name)
            hist = s.get("history") or []
            last = hist[-1] if hist else {}
            started = (last.get("timeline") or {}).get("firstStep") is not None
            fresh = s.get("attempt", 0) > after_attempt and s.get("phase") == "Running"
            if fresh and started and last.get("attempt") == s["attempt"]:
                return s
            # the fault's own restart in place, or one after it when the next generation
            # failed before its first step (seen: a promoted node 0's store port still held)
            if (
                seen is not None
                and s.get("attempt") == after_attempt
                and any(r.get("resumed") for r in _new_in_place(s, seen))
            ):
                return s
            return None

        return poll.until(
            f"{name}: training again",
            ready,
            timeout=300,
            every=0.5,
            diagnosis=lambda: self.context(name),
        )

    def context(self, name: str) -> str:
        """What a user would look at when a recovery does not come: the job's status and
        Events, its pods, and each pod's last log lines (the keepers say what they wait for)."""
        pods = self.jobs.pods(name)
        rows = [
            f"  {p['metadata']['name']} node={p['spec'].get('nodeName')} "
            f"phase={p['status'].get('phase')} labels={p['metadata'].get('labels')} "
            f"deleting={bool(p['metadata'].get('deletionTimestamp'))}"
            for p in pods
        ]
        events = self.cluster.kubectl(
            "get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False
        ).stdout[-4000:]
        logs = [
            f"--- {p['metadata']['name']}\n"
            + self.cluster.kubectl(
                "logs", "-n", NS, p["metadata"]["name"], "--tail=25", check=False
            ).stdout
            for p in pods
        ]
        status = json.dumps(self.status(name), indent=1)[-6000:]
        return "\n".join([f"status: {status}", "pods:", *rows, f"events:\n{events}", *logs])

    @staticmethod
    def recovery(
        s: dict[str, Any],
        fault: dict[str, Any],
        after_attempt: int,
        seen: set[tuple[int, int]],
        history: dict[int, dict[str, Any]],
    ) -> None:
        """What brought the job back after `fault`: a restart in place or a recreated gang, its
        cause, and seconds from the injection to the next first step (as rank 0 stamped it)."""
        new = _new_in_place(s, seen)
        if s.get("attempt", 0) == after_attempt and new:
            r = st.InPlaceRestart.model_validate(
                {k: v for k, v in new[0].items() if k != "attempt"}
            )
            back = next((x for x in new if x.get("resumed")), new[0])
            fault.update(
                recovery="inPlace",
                cause=r.failure.cause.value,
                generation=r.generation,
                fromMemory=r.from_memory,
                firstStep=r.resumed
                or st.InPlaceRestart.model_validate(
                    {k: v for k, v in back.items() if k != "attempt"}
                ).resumed,
                inPlaceRestarts=len(new),
            )
        else:
            ended = history.get(after_attempt) or _entry(s, after_attempt)
            tl_raw = _entry(s, s.get("attempt", 0)).get("timeline")
            tl = st.Timeline.model_validate(tl_raw) if tl_raw else None
            # every attempt this fault ended, and how: a chain longer than one is a recovery
            # that failed again (the cause and words the operator gave each)
            chain = []
            for a in range(after_attempt, s.get("attempt", 0)):
                h = history.get(a) or _entry(s, a)
                words = str((h.get("failure") or {}).get("message", ""))[:300]
                chain.append(
                    {
                        "attempt": a,
                        "cause": h.get("cause"),
                        "message": words,
                        "timeline": h.get("timeline"),
                    }
                )
            fault.update(
                recovery="recreated",
                cause=ended.get("cause"),
                attempts=s.get("attempt", 0) - after_attempt,
                chain=chain,
                firstStep=tl.first_step if tl else None,
                inPlaceRestarts=len(new),
            )
        first = fault.get("firstStep")
        fault["sinceFault"] = round(first - fault["time"], 3) if first is not None else None

    def inject(self, name: str, kind: str, rng: random.Random) -> dict[str, Any]:
        pods = [
            p
            for p in self.jobs.running_pods(name, self.status(name)["attempt"])
            if SPARE_LABEL not in p["metadata"]["labels"]
        ]  # a gang's member, not a spare
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
        self.faults.lose_node(node, freeze=names.Label.JOB.value)
        return {"kind": kind, "pod": pname, "node": node, "time": time.time()}

    def run(
        self,
        label: str,
        every: int | str,
        seed: int,
        *,
        in_place: bool = False,
        spares: int = 0,
        memory_every: int | str = "auto",
        on_s3: bool = False,
    ) -> Run:
        name = "soak-" + re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        store = None
        if on_s3:
            store = self.cluster.object_store
            store.create_bucket(S3_BUCKET)
            secret = json.dumps(store.secret(S3_SECRET))
            self.cluster.kubectl("apply", "-n", NS, "-f", "-", input=secret)
        rng = random.Random(seed)
        draws = [rng.expovariate(1.0 / self.args.mtbf) for _ in range(self.args.failures)]
        picks = [
            rng.choice(KINDS) if self.args.faults == "mixed" else self.args.faults
            for _ in range(self.args.failures)
        ]
        chooser = random.Random(seed + 1)  # which pod / rank: same sequence for every config
        prior = self.args.prior_factor * self.args.mtbf
        self.jobs.apply(
            job_doc(
                name,
                every=every,
                prior=prior,
                in_place=in_place,
                spares=spares,
                memory_every=memory_every,
                store=store,
            )
        )
        run = Run(label, every, in_place=in_place, spares=spares, memory_every=memory_every)
        started = time.time()
        s = self.training_again(name, 0)
        try:
            for i, (wait, kind) in enumerate(zip(draws, picks, strict=True)):
                until = time.time() + wait
                while time.time() < until:
                    now = self.status(name)
                    ci = (now.get("checkpointInterval") or {}).get("steps")
                    if ci:
                        run.interval_samples.append(int(ci))
                    tier = now.get("memoryTier") or {}
                    if tier.get("intervalSteps"):
                        run.memory_samples.append(int(tier["intervalSteps"]))
                    if tier.get("saveSeconds") is not None:
                        run.memory_saves.append(float(tier["saveSeconds"]))
                    time.sleep(min(1.0, max(0.0, until - time.time())))
                before = self.status(name)
                run.remember(before)
                attempt, seen = before["attempt"], _in_place_keys(before)
                fault = self.inject(name, kind, chooser)
                s = self.training_again(name, attempt, seen if self.args.in_place else None)
                if kind == "node":
                    self.faults.restore_node(fault["node"])
                fault["resumedAttempt"] = s["attempt"]
                run.remember(s)
                if self.args.in_place:
                    self.recovery(s, fault, attempt, seen, run.history)
                run.faults.append(fault)
                how = ""
                if fault.get("recovery"):
                    since = fault.get("sinceFault")
                    how = (
                        f" ({fault['recovery']}, cause {fault.get('cause')}"
                        + (f", {since:.1f}s after the fault" if since is not None else "")
                        + (", from memory" if fault.get("fromMemory") else "")
                        + ")"
                    )
                print(
                    f"  {label}: fault {i + 1}/{len(draws)} {kind} after {wait:.1f}s; "
                    f"training again in attempt {s['attempt']}{how}",
                    flush=True,
                )
            time.sleep(2.0)  # a last scrape of the attempt that is training now
            run.status = self.status(name)
            if self.args.in_place:  # goodput is rewritten at most every 30 s: a fresh one
                run.status = self.fresh_goodput(name, after=time.time())
        finally:
            run.wall = time.time() - started
            self.cluster.kubectl(
                "delete", "fsdpjob", name, "-n", NS, "--wait=true", "--timeout=120s", check=False
            )
            for node in {f["node"] for f in run.faults if f.get("node")}:
                self.faults.restore_node(node)
            poll.until("pods gone", lambda: not self.jobs.pods(name), timeout=120)
        return run

    def fresh_goodput(self, name: str, *, after: float) -> dict[str, Any]:
        """The status once its goodput was computed at or after `after` (up to 45 s)."""

        def fresh() -> dict[str, Any] | None:
            s = self.status(name)
            g = s.get("goodput") or {}
            if not g.get("since"):
                return None
            at = st.unix_seconds(g["since"])
            done = isinstance(at, float | int) and at + float(g.get("wallSeconds") or 0) >= after
            return s if done else None

        try:
            return poll.until(f"{name}: goodput rewritten", fresh, timeout=45, every=1.0)
        except AssertionError:
            return self.status(name)


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
        interval_seconds=tau,
        save_seconds=m["saveSeconds"],
        restart_seconds=m["restartSeconds"],
        mtbf_seconds=m["mtbfSeconds"],
        fail_while_restarting=False,
    )


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
    print(
        f"\nmodel: save {m['saveSeconds']:.3f}s, restart {m['restartSeconds']:.1f}s, MTBF "
        f"{m['mtbfSeconds']:g}s -> optimum {m['optimumSeconds']:.1f}s, goodput "
        f"{100 * m['optimumGoodput']:.1f}%"
    )
    print(f"{'run':<16}{'interval':>10}{'seconds':>9}{'goodput':>9}{'steady':>8}{'model':>8}")
    for r in result["runs"]:
        secs = r["intervalSeconds"] or 0.0
        print(
            f"{r['label']:<16}{r['meanIntervalSteps'] or 0:>10.0f}{secs:>9.1f}"
            f"{100 * (r['goodput'] or 0):>8.1f}%{100 * (r['goodputSteady'] or 0):>7.1f}%"
            f"{100 * r.get('modelGoodput', 0):>7.1f}%"
        )


def plot(result: dict[str, Any], path: Path, title: str | None = None) -> None:
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
        ax.scatter(
            [r["intervalSeconds"]],
            [100 * r["goodputSteady"]],
            s=70 if auto else 40,
            marker="*" if auto else "o",
            zorder=3,
            color="tab:red" if auto else "tab:blue",
            label=f"{r['label']} (measured)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("compute between checkpoints (s, log)")
    ax.set_ylabel("goodput (%), start-up excluded")
    ax.set_title(
        title
        or f"goodput vs checkpoint interval: MTBF {m['mtbfSeconds']:.0f}s, "
        f"{result['args']['faults']} faults"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def in_place_summary(run: Run, step_s: float) -> dict[str, Any]:
    """A run's summary with what the in-place comparison reads: time to resume per cause (from
    the operator's records and from each fault's injection), loads from memory and the claim."""
    out = run.summary(step_s)
    out["inPlaceRestarts"] = IN_PLACE_RESTARTS if run.in_place else 0
    out["memory"] = dict(MEMORY_TIER) if run.in_place else None
    out["spares"] = run.spares
    out["resumesByCause"] = by_cause(out["resumes"])
    since = [
        {"cause": f.get("cause"), "how": f.get("recovery"), "seconds": f["sinceFault"]}
        for f in run.faults
        if f.get("sinceFault") is not None
    ]
    out["sinceFaultByCause"] = by_cause(since)
    loads = [x.get("fromMemory") for x in out["resumes"] if x.get("how") == "inPlace"]
    out["inPlaceLoads"] = {
        "memory": loads.count(True),
        "claim": loads.count(False),
        "unknown": loads.count(None),
    }
    out["recoveries"] = {
        how: sum(1 for f in run.faults if f.get("recovery") == how)
        for how in ("inPlace", "recreated")
    }
    out["causeMismatches"] = [
        {"kind": f["kind"], "cause": f.get("cause"), "recovery": f.get("recovery")}
        for f in run.faults
        if f.get("cause") != EXPECTED_CAUSE.get(f["kind"])
    ]
    out["attempt"] = run.status.get("attempt")
    out["restarts"] = run.status.get("restarts")
    return out


def machine_note(args: argparse.Namespace) -> str:
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 2**20
    gpu = "a GPU" if Path("/dev/nvidia0").exists() else "no GPU"
    return (
        f"{os.cpu_count()} cores, {mem} GiB, {gpu}; local control plane + {args.nodes} "
        "kubelet nodes (containerd); operator as a host process"
    )


def tree() -> str:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "status",
            "--porcelain",
            "operator",
            "worker",
            "bench",
            "crds",
            "harness",
            "localcluster",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    changed = sorted(line[3:] for line in dirty.splitlines() if line.strip())
    return head + (f" + uncommitted {', '.join(changed)}" if changed else "")


def report_in_place(result: dict[str, Any]) -> None:
    runs = result["runs"]
    print(f"\n{'run':<10}{'goodput':>9}{'steady':>8}  recoveries  in-place loads (memory/claim)")
    for r in runs:
        rec, loads = r["recoveries"], r["inPlaceLoads"]
        print(
            f"{r['label']:<10}{100 * (r['goodput'] or 0):>8.1f}%"
            f"{100 * (r['goodputSteady'] or 0):>7.1f}%  "
            f"{rec['inPlace']:>2} in place, {rec['recreated']:>2} recreated  "
            f"{loads['memory']}/{loads['claim']}"
        )
    print("\ntime to resume, s (operator's record; injection -> next first step in brackets)")
    print(f"{'cause':<24}" + "".join(f"{r['label'] + ' n / p50 / mean / max':>40}" for r in runs))
    causes = sorted({c for r in runs for c in r["resumesByCause"]})
    for c in causes:
        row = f"{c:<24}"
        for r in runs:
            x, y = r["resumesByCause"].get(c), r["sinceFaultByCause"].get(c)
            cell = f"{x['n']} / {x['p50']:.1f} / {x['mean']:.1f} / {x['max']:.1f}" if x else "-"
            cell += f" [{y['p50']:.1f}]" if y else ""
            row += f"{cell:>40}"
        print(row)
    print("\nlost seconds by cause")
    lost = sorted({c for r in runs for c in (r["lostSeconds"] or {})})
    for c in lost:
        print(f"{c:<24}" + "".join(f"{(r['lostSeconds'] or {}).get(c, 0.0):>12.1f}" for r in runs))
    print(f"{'wall':<24}" + "".join(f"{r['wallSeconds'] or 0.0:>12.1f}" for r in runs))


def plot_in_place(result: dict[str, Any], path: Path) -> None:
    """Left: each injected fault to the next first step (every fault, by the cause the
    operator gave it); right: the operator's own records (the history it still held)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    panels = (
        ("sinceFaultByCause", "injected fault -> next first step"),
        ("resumesByCause", "operator's record: failure -> first step"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        causes = sorted({c for r in runs for c in r[key] if "(" not in c})
        width = 0.8 / max(1, len(runs))
        for i, r in enumerate(runs):
            xs = [j + i * width for j in range(len(causes))]
            cells = [r[key].get(c) for c in causes]
            p50 = [c["p50"] if c else 0.0 for c in cells]
            top = [c["max"] - c["p50"] if c else 0.0 for c in cells]
            label = (
                f"{r['label']}: goodput {100 * (r['goodput'] or 0):.1f}% "
                f"(steady {100 * (r['goodputSteady'] or 0):.1f}%)"
            )
            ax.bar(xs, p50, width, yerr=[[0.0] * len(top), top], capsize=3, label=label)
            for x, c in zip(xs, cells, strict=True):
                if c:
                    ax.text(x, 0.5, f"n={c['n']}", ha="center", fontsize=7, color="white")
        ax.set_xticks(
            [j + width * (len(runs) - 1) / 2 for j in range(len(causes))], causes, fontsize=8
        )
        ax.set_ylabel("seconds: p50 (bar) to max")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    args = result["args"]
    fig.suptitle(
        f"gang recreated vs restarted in place: MTBF {float(args['mtbf']):g}s, "
        f"{args['failures']} {args['faults']} faults, same draws",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def memory_model(auto: dict[str, Any], step_s: float, mtbf: float) -> dict[str, Any]:
    """Daly's model for the memory tier's interval, from the in-place auto run's measurements:
    its memory saves' blocking seconds (median of rank 0's last-save gauge, sampled), its step,
    and its mean time to resume (every restart, in place or recreated)."""
    save = float(auto.get("memorySaveSeconds") or 0.0)
    resumes = [x["seconds"] for x in auto["resumes"] if x.get("seconds")]
    optimum = interval.daly_interval_seconds(save, mtbf)
    return {
        "saveSeconds": save,
        "stepSeconds": step_s,
        "mtbfSeconds": mtbf,
        "restartSeconds": statistics.mean(resumes) if resumes else 0.0,
        "optimumSeconds": optimum,
        "optimumSteps": max(1, round(optimum / step_s)),
    }


def memory_sweep(result: dict[str, Any]) -> dict[str, Any] | None:
    """The sweep's runs (the auto run it varies and the fixed memory intervals) against the
    model: each run's model goodput, and how far auto is from the optimum and the best fixed."""
    m = result.get("memoryModel")
    if not m:
        return None
    label = result["memorySweepOf"]
    runs = [r for r in result["runs"] if r["label"] == label or r["label"].startswith("memory ")]
    m["optimumGoodput"] = _model(m["optimumSeconds"], m)
    for r in runs:
        if r.get("memoryIntervalSeconds"):
            r["memoryModelGoodput"] = _model(r["memoryIntervalSeconds"], m)
    auto = next(r for r in runs if r["label"] == label)
    fixed = [r for r in runs if r is not auto and r.get("goodputSteady") is not None]
    best = max(fixed, key=lambda r: r["goodputSteady"], default=None)
    steady = auto.get("goodputSteady") or 0.0
    return {
        "runs": [r["label"] for r in runs],
        "autoSteady": auto.get("goodputSteady"),
        "pointsUnderModelOptimum": round(100 * (m["optimumGoodput"] - steady), 1),
        "bestFixed": best["label"] if best else None,
        "pointsUnderBestFixed": (
            round(100 * (best["goodputSteady"] - auto["goodputSteady"]), 1)
            if best and auto.get("goodputSteady") is not None
            else None
        ),
    }


def report_memory_sweep(result: dict[str, Any]) -> None:
    sweep = result.get("memorySweep")
    if not sweep:
        return
    m = result["memoryModel"]
    print(
        f"\nmemory tier: save {m['saveSeconds']:.3f}s, restart {m['restartSeconds']:.1f}s, "
        f"MTBF {m['mtbfSeconds']:g}s -> optimum {m['optimumSeconds']:.2f}s "
        f"({m['optimumSteps']} steps), model {100 * m['optimumGoodput']:.1f}%"
    )
    print(f"{'run':<16}{'memory every':>13}{'seconds':>9}{'goodput':>9}{'steady':>8}{'model':>8}")
    for r in result["runs"]:
        if r["label"] not in sweep["runs"]:
            continue
        print(
            f"{r['label']:<16}{r['meanMemoryIntervalSteps'] or 0:>13.1f}"
            f"{r['memoryIntervalSeconds'] or 0:>9.2f}{100 * (r['goodput'] or 0):>8.1f}%"
            f"{100 * (r['goodputSteady'] or 0):>7.1f}%"
            f"{100 * r.get('memoryModelGoodput', 0):>7.1f}%"
        )
    print(
        f"auto: {sweep['pointsUnderModelOptimum']} points under the model's optimum, "
        f"{sweep['pointsUnderBestFixed']} under the best fixed ({sweep['bestFixed']})"
    )


def plot_memory_sweep(result: dict[str, Any], path: Path) -> None:
    """The memory tier's interval against goodput, as plot() draws the claim's."""
    sweep = result.get("memorySweep")
    if not sweep:
        return
    runs = [
        {
            "label": r["label"] + (": auto" if r["memoryIntervalSteps"] == "auto" else ""),
            "intervalSeconds": r.get("memoryIntervalSeconds"),
            "goodputSteady": r.get("goodputSteady"),
            "intervalSteps": r["memoryIntervalSteps"],
        }
        for r in result["runs"]
        if r["label"] in sweep["runs"]
    ]
    title = (
        f"in place: goodput vs the memory tier's interval (claim: auto), MTBF "
        f"{float(result['args']['mtbf']):g}s"
    )
    plot({"model": result["memoryModel"], "runs": runs}, path, title)


def main_in_place(soak: Soak, args: argparse.Namespace, began: float, crd_patch: list[str]) -> int:
    """Recreate, then in place (then with spares), the same draws one after the other; with
    --memory-factors, then fixed memory-tier intervals around the model's optimum."""
    runs: list[Run] = []
    result: dict[str, Any] = {
        "what": "the goodput soak's 1x/auto configuration, the same seeded fault draws twice: "
        "recreate (failurePolicy.inPlaceRestarts 0), then in-place (inPlaceRestarts "
        f"{IN_PLACE_RESTARTS}, checkpoint.memory {MEMORY_TIER}); time to resume: an in-place "
        "restart's resumed - failure.time, a recreated gang's history timeline failed -> "
        "firstStep; sinceFault: the fault's injection -> the next first step; with --spares a "
        "third run, in-place with spec.spares; with --memory-factors, the last of those again "
        "with checkpoint.memory.intervalSteps fixed at those multiples of Daly's optimum for "
        "the memory tier's measured save (the claim's interval stays auto)",
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine_note(args),
        "tree": tree(),
        "crdPatch": crd_patch,
    }

    def save() -> None:
        step_s = _costs(runs[0])[1] if runs else 0.0
        result["runs"] = [in_place_summary(r, step_s) for r in runs]
        result["memorySweep"] = memory_sweep(result)  # each run's model goodput too
        result["benchSeconds"] = round(time.time() - began, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    plan = [] if args.no_baselines else [("recreate", False, 0), ("in-place", True, 0)]
    if args.spares:
        plan.append(("spares", True, args.spares))
    elif args.no_baselines:
        plan.append(("in-place", True, 0))
    if args.object_store:  # the last configuration again, its checkpoints in the S3 bucket
        label, in_place, spares = plan[-1]
        plan.append((f"{label} s3", in_place, spares))
    for label, in_place, spares in plan:
        print(
            f"{label}: intervalSteps auto, inPlaceRestarts "
            f"{IN_PLACE_RESTARTS if in_place else 0}, spares {spares}",
            flush=True,
        )
        on_s3 = label.endswith(" s3")
        runs.append(
            soak.run(label, "auto", args.seed, in_place=in_place, spares=spares, on_s3=on_s3)
        )
        save()
    factors = [float(f) for f in args.memory_factors.split(",") if f.strip()]
    if factors:
        label, _, spares = plan[-1]
        swept = runs[-1]
        m = memory_model(in_place_summary(swept, _costs(swept)[1]), _costs(swept)[1], args.mtbf)
        result["memoryModel"], result["memorySweepOf"] = m, label
        print(
            f"memory tier measured: save {m['saveSeconds']:.3f}s, step "
            f"{m['stepSeconds']:.4f}s -> optimum {m['optimumSeconds']:.2f}s = "
            f"{m['optimumSteps']} steps",
            flush=True,
        )
        for f in factors:
            steps = max(1, round(m["optimumSteps"] * f))
            print(f"memory {f:g}x: checkpoint.memory.intervalSteps {steps}", flush=True)
            runs.append(
                soak.run(
                    f"memory {f:g}x",
                    "auto",
                    args.seed,
                    in_place=True,
                    spares=spares,
                    memory_every=steps,
                )
            )
            save()
    try:
        plot_in_place(result, args.plot)
        plot_memory_sweep(result, args.plot.with_name(args.plot.stem + "_memory.png"))
    except Exception as e:  # the numbers are written already
        print(f"no plot: {e}", flush=True)
    report_in_place(result)
    report_memory_sweep(result)
    print(f"wrote {args.out} and {args.plot} in {result['benchSeconds']:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtbf", type=float, default=40.0, help="mean training seconds per fault")
    parser.add_argument("--failures", type=int, default=10, help="faults per configuration")
    parser.add_argument("--faults", choices=[*KINDS, "mixed"], default="mixed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--factors", default="0.25,1,4", help="fixed intervals, x the optimum")
    parser.add_argument("--repeat", type=int, default=1, help="extra 1x runs, same draws")
    parser.add_argument("--reseed", type=int, default=1, help="extra 1x runs, other draws")
    parser.add_argument(
        "--prior-factor",
        type=float,
        default=2.0,
        help="autoInterval.priorMtbfSeconds as a multiple of --mtbf",
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--out", type=Path, help=f"default {OUT} ({OUT_IN_PLACE} --in-place)")
    parser.add_argument("--plot", type=Path, help=f"default {PLOT} ({PLOT_IN_PLACE} --in-place)")
    parser.add_argument("--replot", type=Path, help="only re-analyse and re-plot this result")
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="recreate against restarts in place (with the memory tier), " "the same draws",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=0,
        help="with --in-place: a third run, in place with spec.spares N "
        "(--nodes must leave a node for them)",
    )
    parser.add_argument(
        "--memory-factors",
        default="",
        help="with --in-place: then fixed checkpoint.memory intervals at these "
        "multiples of the memory tier's optimum (e.g. 0.25,1,4)",
    )
    parser.add_argument(
        "--no-baselines",
        action="store_true",
        help="with --in-place: skip the recreate and plain in-place runs when "
        "--spares is given (only the runs --memory-factors compares)",
    )
    parser.add_argument(
        "--no-build", action="store_true", help="use the images podman holds now; do not build them"
    )
    parser.add_argument(
        "--object-store",
        action="store_true",
        help="--in-place: run the last configuration again with its checkpoints in the local "
        "cluster's S3 server (versitygw) instead of the claim, on the same draws",
    )
    args = parser.parse_args(argv)
    args.out = args.out or (OUT_IN_PLACE if args.in_place else OUT)
    args.plot = args.plot or (PLOT_IN_PLACE if args.in_place else PLOT)
    if args.replot and args.in_place:
        written = json.loads(args.replot.read_text())
        written["memorySweep"] = memory_sweep(written)
        args.replot.write_text(json.dumps(written, indent=1))
        plot_in_place(written, args.plot)
        plot_memory_sweep(written, args.plot.with_name(args.plot.stem + "_memory.png"))
        report_in_place(written)
        report_memory_sweep(written)
        return 0
    if args.replot:
        written = json.loads(args.replot.read_text())
        analyse(written)
        args.replot.write_text(json.dumps(written, indent=1))
        plot(written, args.plot)
        report(written)
        return 0
    began = time.time()
    state = Path(tempfile.mkdtemp(prefix="fsdp-goodput-"))
    if not args.no_build:
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
        crd_patch = crd_without_memory_default(cluster, state)
        if args.in_place:
            return main_in_place(soak, args, began, crd_patch)
        print(f"auto (prior MTBF {args.prior_factor:g}x the injected {args.mtbf:g}s)", flush=True)
        runs = [soak.run("auto", "auto", args.seed)]
        save_s, step_s = _costs(runs[0])
        optimum = interval.daly_interval_seconds(save_s, args.mtbf)
        best = max(1, round(optimum / step_s))
        print(
            f"measured: save {save_s:.3f}s, step {step_s:.4f}s -> optimum {optimum:.1f}s "
            f"= {best} steps",
            flush=True,
        )
        plan = [
            (f"{f}x", max(1, round(best * float(f))), args.seed) for f in args.factors.split(",")
        ]
        plan += [(f"1x repeat {i + 1}", best, args.seed) for i in range(args.repeat)]
        plan += [
            (f"1x seed {args.seed + 100 + i}", best, args.seed + 100 + i)
            for i in range(args.reseed)
        ]
        model = {
            "saveSeconds": save_s,
            "stepSeconds": step_s,
            "mtbfSeconds": args.mtbf,
            "optimumSeconds": optimum,
            "optimumSteps": best,
        }
        result: dict[str, Any] = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "model": model,
        }
        if crd_patch:
            result["crdPatch"] = crd_patch

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
