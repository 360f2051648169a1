"""`fsdpctl`: what happened to my training job, and what it cost.

Read-only views over FSDPJob status and Events (`list`, `describe`), over the evidence the
operator keeps of failed attempts (`why`, `logs`), plus `suspend`/`resume`.
Renders with rich. Talks to the API only through kube.py's client loader; makes no decisions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fsdp_operator import api, kube, names, status

# Stops the operator made on purpose: not failures, so `why` does not list them.
_PLANNED = (status.Cause.RESIZE.value, status.Cause.SUSPENDED.value, None)


def _age(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    secs = int(now - ts)
    return (
        f"{secs // 3600}h{secs % 3600 // 60:02d}m"
        if secs >= 3600
        else f"{secs // 60}m{secs % 60:02d}s"
    )


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}{suffix}"
    return f"{value}{suffix}"


def _jobs(custom: Any, namespace: str | None) -> list[dict[str, Any]]:
    if namespace:
        resp = custom.list_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, _preload_content=False
        )
    else:
        resp = custom.list_cluster_custom_object(
            api.GROUP, api.VERSION, api.PLURAL, _preload_content=False
        )
    return list(json.loads(resp.data)["items"])


def list_jobs(custom: Any, namespace: str | None, console: Console) -> None:
    now = datetime.datetime.now(datetime.UTC).timestamp()
    table = Table(title="FSDPJobs")
    for col in (
        "namespace",
        "name",
        "phase",
        "world",
        "step",
        "ckpt",
        "ckpt age",
        "restarts",
        "app/infra",
        "reason",
    ):
        table.add_column(col)
    for job in _jobs(custom, namespace):
        s = job.get("status") or {}
        ck = s.get("lastCheckpoint") or {}
        r = s.get("restarts") or {}
        table.add_row(
            Text(job["metadata"]["namespace"]),
            Text(job["metadata"]["name"]),
            Text(s.get("phase", "-")),
            _fmt(s.get("worldSize")),
            _fmt(s.get("step")),
            _fmt(ck.get("step")),
            _age(ck.get("time"), now),
            _fmt(r.get("total", 0)),
            f"{r.get('application', 0)}/{r.get('infrastructure', 0)}",
            Text(s.get("reason", "")),
        )
    console.print(table)


def describe(custom: Any, core: Any, namespace: str, name: str, console: Console) -> None:
    resp = custom.get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, _preload_content=False
    )
    job = json.loads(resp.data)
    s = job.get("status") or {}
    head = Text(f"{namespace}/{name}", style="bold")
    head.append(
        f"  phase={s.get('phase')}  attempt={s.get('attempt')}  world={s.get('worldSize')}  "
        f"step={s.get('step')}"
    )
    console.print(head)
    console.print(Text(_checkpoints_line(s)))
    if lf := s.get("lastFailure"):
        # Text, not markup: a worker's message (say gloo's "[/pytorch/...]") is not rich markup.
        console.print(
            Text(
                f"last failure: {lf.get('cause')} rank={lf.get('rank')} pod={lf.get('pod')} "
                f"node={lf.get('node')} exit={lf.get('exitCode')}: {lf.get('message')}"
            )
        )
    hist = Table(title="attempts: what each failure cost")
    for col in ("attempt", "world", "resumed from", "ended by", "detect", "recover", "steps lost"):
        hist.add_column(col)
    lost = 0
    for h in s.get("history") or []:
        lost += h.get("stepsLost") or 0
        hist.add_row(
            str(h.get("attempt")),
            _fmt(h.get("worldSize")),
            _fmt(h.get("resumedFromStep")),
            h.get("cause") or ("running" if h.get("ended") is None else "-"),
            _fmt(h.get("detectSeconds"), "s"),
            _fmt(h.get("recoverSeconds"), "s"),
            _fmt(h.get("stepsLost")),
        )
    console.print(hist)
    console.print(f"total steps redone after restarts: {lost}")
    console.print(_resume_table(s.get("history") or []))
    for line in _cost_lines(s):
        console.print(Text(line))
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    items = sorted(json.loads(events.data)["items"], key=lambda e: e.get("firstTimestamp") or "")
    ev = Table(title="events")
    for col in ("time", "type", "reason", "message"):
        ev.add_column(col)
    for e in items[-20:]:
        ev.add_row(
            e.get("firstTimestamp") or "",
            Text(e.get("type", "")),
            Text(e.get("reason", "")),
            Text(e.get("message", "")),
        )
    console.print(ev)


def _checkpoints_line(s: dict[str, Any]) -> str:
    """The newest checkpoint, and what the current attempt loads (or its pods choose)."""
    last = (s.get("lastCheckpoint") or {}).get("path") or "-"
    where = s.get("resumePath")
    if where == "auto":
        loads = "the checkpoint its pods choose (the operator cannot read them)"
    else:
        loads = where or "nothing (started fresh)"
    return (
        f"checkpoints: newest sealed step {_fmt(s.get('sealedStep'))} ({last}); "
        f"attempt {_fmt(s.get('attempt'))} loads {loads}"
    )


def _resume_table(history: list[dict[str, Any]]) -> Table:
    """Each attempt's way back to training, phase by phase (status.history[].timeline)."""
    table = Table(title="time to resume: failure -> first step, by phase (seconds)")
    phases = [phase for phase, _ in status.PHASES]
    for col in ("attempt", "after", *phases, "total"):
        table.add_column(col)
    for h in history:
        raw = h.get("timeline")
        if not raw:
            continue
        tl = status.Timeline.model_validate(raw)
        secs = dict(status.breakdown(tl))
        total = status.time_to_resume(tl)
        table.add_row(
            str(h.get("attempt")),
            tl.cause.value if tl.cause else "(start)",
            *(_fmt(secs.get(p)) for p in phases),
            _fmt(total),
        )
    return table


def _sig(seconds: float | None) -> str:
    return "unmeasured" if seconds is None else f"{seconds:.3g}s"


def _cost_lines(s: dict[str, Any]) -> list[str]:
    lines = []
    if g := s.get("goodput"):
        lost = g.get("lostSeconds") or {}
        split = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(lost.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"goodput {100 * g.get('fraction', 0.0):.1f}%: {g.get('productiveSeconds', 0.0):.1f}s "
            f"of {g.get('wallSeconds', 0.0):.1f}s trained steps that count; lost: {split or '-'} "
            f"(of which steps redone {g.get('redoneSeconds', 0.0):.1f}s)"
        )
    if ci := s.get("checkpointInterval"):
        how = "fixed"
        if ci.get("auto"):
            mtbf = ci.get("mtbfSeconds")
            hours = f"{mtbf / 3600:.2f}h" if mtbf else "-"
            how = (
                f"auto: save {_sig(ci.get('saveSeconds'))}, step {_sig(ci.get('stepSeconds'))}, "
                f"MTBF {hours} ({ci.get('failures') or 0} failures)"
            )
        lines.append(f"checkpoint interval: {ci.get('steps')} steps ({how})")
    return lines


def _read_job(custom: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The FSDPJob, or None when there is none: a mistyped name deserves a sentence, not a trace."""
    try:
        resp = custom.get_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, _preload_content=False
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        print(f"fsdpctl: no FSDPJob {name} in namespace {namespace}", file=sys.stderr)
        return None
    return dict(json.loads(resp.data))


def why(custom: Any, namespace: str, name: str, console: Console) -> int:
    """Each failed attempt, oldest first: what failed where and why, and where the evidence is.

    Reads status.history (not only lastFailure) so that a failure that repeats, or an earlier
    one that caused it, stays visible after the next attempt fails.
    """
    job = _read_job(custom, namespace, name)
    if job is None:
        return 1
    nproc = (job.get("spec") or {}).get("nprocPerNode") or 1
    failed = [
        h
        for h in (job.get("status") or {}).get("history") or []
        if h.get("failure") or h.get("cause") not in _PLANNED
    ]
    if not failed:
        console.print(Text(f"{namespace}/{name} has not failed"))
        return 0
    for h in failed:
        n, f = h.get("attempt"), h.get("failure") or {}
        head = f"attempt {n}: {f.get('cause') or h.get('cause')}"
        console.print(Text(head + (f" at step {f['step']}" if f.get("step") is not None else "")))
        if not f:  # an older operator recorded only the cause
            continue
        if f.get("pod"):
            exit_code = f" exit code {f['exitCode']}" if f.get("exitCode") is not None else ""
            console.print(
                Text(
                    f"  first failing pod: {f['pod']} (node rank {_fmt(f.get('rank'))}, "
                    f"node {_fmt(f.get('node'))}){exit_code}"
                )
            )
        for key in ("phase", "message", "diagnosis", "evidence"):
            if f.get(key):
                console.print(Text(f"  {key}: " + str(f[key]).replace("\n", "\n    ")))
        if ref := f.get("evidenceRef"):
            rank = f" --rank {f['rank'] * nproc}" if f.get("rank") is not None else ""
            console.print(
                Text(
                    f"  full evidence: configmap/{ref} in {namespace}; logs: "
                    f"fsdpctl -n {namespace} logs {name} --attempt {n}{rank}"
                )
            )
    return 0


def logs(
    custom: Any,
    core: Any,
    namespace: str,
    name: str,
    attempt: int | None,
    rank: int | None,
    console: Console,
) -> int:
    """A failed attempt's last log lines, pod by pod, as the operator kept them before it
    deleted the pods; `rank` (a global rank) narrows them to the pod that ran it."""
    job = _read_job(custom, namespace, name)
    if job is None:
        return 1
    history = (job.get("status") or {}).get("history") or []
    if attempt is None:
        kept = [h.get("attempt") for h in history if (h.get("failure") or {}).get("evidenceRef")]
        if not kept:
            print(f"fsdpctl: no evidence kept for {namespace}/{name}", file=sys.stderr)
            return 1
        attempt = int(kept[-1])
    failure = next((h.get("failure") or {} for h in history if h.get("attempt") == attempt), {})
    ref = failure.get("evidenceRef") or names.evidence_name(name, attempt=attempt)
    try:
        resp = core.read_namespaced_config_map(ref, namespace, _preload_content=False)
    except ApiException as exc:
        if exc.status != 404:
            raise
        print(
            f"fsdpctl: no evidence kept for attempt {attempt} of {name} "
            "(the operator keeps the newest 5 failed attempts)",
            file=sys.stderr,
        )
        return 1
    data = json.loads(resp.data).get("data") or {}
    meta = json.loads(data.get("failure.json") or "{}")
    nproc = meta.get("nprocPerNode") or 1
    pods = sorted(int(k[4:-4]) for k in data if k.startswith("log-") and k.endswith(".txt"))
    if rank is not None:
        if rank // nproc not in pods:
            have = ", ".join(_ranks(p, nproc) for p in pods) or "none"
            print(
                f"fsdpctl: attempt {attempt} of {name} kept no log of rank {rank}; "
                f"ranks kept: {have}",
                file=sys.stderr,
            )
            return 2
        pods = [rank // nproc]
    for p in pods:
        head = f"attempt {attempt}, pod {p} (ranks {_ranks(p, nproc)})"
        if meta.get("rank") == p and meta.get("pod"):
            head += f", {meta['pod']}"
        if meta.get("firstPod") == p:
            head += ", first error of the gang"
        console.print(Text(head, style="bold"))
        console.print(Text(data[f"log-{p}.txt"].rstrip("\n")), soft_wrap=True)
    return 0


def _ranks(pod: int, nproc: int) -> str:
    """The global ranks one pod ran: torchrun gives pod P ranks P*nproc .. (P+1)*nproc-1."""
    return f"{pod * nproc}-{(pod + 1) * nproc - 1}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsdpctl", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--namespace", default=None)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every FSDPJob with phase, step, checkpoint and restarts")
    for verb in ("describe", "suspend", "resume"):
        sub.add_parser(verb).add_argument("name")
    sub.add_parser("why", help="each failed attempt: cause, where, diagnosis").add_argument("name")
    logs_p = sub.add_parser("logs", help="the last log lines a failed attempt's pods left")
    logs_p.add_argument("name")
    logs_p.add_argument("--attempt", type=int, help="default: the newest with evidence kept")
    logs_p.add_argument("--rank", type=int, help="global rank: only the pod that ran it")
    args = parser.parse_args(argv)
    client = kube.load_client()
    custom = kubernetes.client.CustomObjectsApi(client)
    console = Console()
    if args.command == "list":
        list_jobs(custom, args.namespace, console)
        return 0
    namespace = args.namespace or "default"
    if args.command == "describe":
        describe(custom, kubernetes.client.CoreV1Api(client), namespace, args.name, console)
        return 0
    if args.command == "why":
        return why(custom, namespace, args.name, console)
    if args.command == "logs":
        core = kubernetes.client.CoreV1Api(client)
        return logs(custom, core, namespace, args.name, args.attempt, args.rank, console)
    custom.patch_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        namespace,
        api.PLURAL,
        args.name,
        {"spec": {"suspend": args.command == "suspend"}},
    )
    done = "suspended" if args.command == "suspend" else "resumed"
    console.print(Text(f"{namespace}/{args.name}: {done}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
