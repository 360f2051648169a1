"""`fsdpctl`: what happened to my training job, and what it cost.

Read-only views over FSDPJob status and Events (`list`, `describe`), over the evidence the
operator keeps of failed attempts (`why`, `logs`), plus `suspend`/`resume`.
Renders with rich. Talks to the API only through kube.py's client loader; makes no decisions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import io
import json
import os
import sys
from typing import Any

import argcomplete
import argcomplete.shell_integration
import kubernetes
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fsdp_operator.io import kube
from fsdp_operator.types import api, names, status
from fsdp_worker.contract import CONTRACT_VERSION as CONTRACT

# Stops the operator made on purpose: not failures, so `why` does not list them.
_PLANNED = (
    status.Cause.RESIZE.value,
    status.Cause.SUSPENDED.value,
    status.Cause.PREEMPTED.value,
    None,
)


# Phase names as column headers short enough for 80 columns (the caption spells them out).
_SHORT = {"teardown": "down", "schedule": "sched", "rendezvous": "rdzv", "firstStep": "step1"}


def _table(title: str, columns: tuple[str, ...], *, wide: tuple[str, ...] = ()) -> Table:
    """A table that stays readable in 80 columns: no vertical rules, one space between columns,
    headers never cut; only the `wide` columns (names, messages) fold their cells."""
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    for col in columns:
        if col in wide:
            table.add_column(col, overflow="fold", min_width=max(len(col), 8))
        else:
            table.add_column(col, no_wrap=True, min_width=len(col))
    return table


def _age(ts: str | float | None, now: float) -> str:
    """How long ago a status time (RFC 3339; a number from an operator before 0.2) was."""
    at = status.unix_seconds(ts)
    if not isinstance(at, int | float):
        return "-"
    secs = int(now - at)
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


_LIST_COLUMNS: tuple[str, ...] = (
    "namespace",
    "name",
    "phase",
    "world",
    "step",
    "ckpt",
    "restarts",
    "reason",
)
_WIDE_COLUMNS = ("attempt", "goodput", "age", "last failure")


def _last_failure(s: dict[str, Any]) -> str:
    """-o wide: the latest failure, where: `OOMKilled pod 3 (gpu-node-7)`."""
    failure = s.get("lastFailure") or {}
    if not failure:
        return "-"
    said = str(failure.get("cause", "?"))
    if failure.get("rank") is not None:
        said += f" pod {failure['rank']}"
    return said + (f" ({failure['node']})" if failure.get("node") else "")


def list_jobs(custom: Any, namespace: str | None, console: Console, *, wide: bool = False) -> None:
    now = datetime.datetime.now(datetime.UTC).timestamp()
    columns, folded = _LIST_COLUMNS, ("namespace", "name", "reason", "last failure")
    if wide:  # more than 80 columns: what `kubectl get -o wide` users look for next
        columns += _WIDE_COLUMNS
    table = _table("FSDPJobs", columns, wide=folded)
    table.caption = "ckpt: newest sealed step (its age); restarts: total (application/infra)"
    for job in _jobs(custom, namespace):
        s = job.get("status") or {}
        ck = s.get("lastCheckpoint") or {}
        r = s.get("restarts") or {}
        row: list[str | Text] = [
            Text(job["metadata"]["namespace"]),
            Text(job["metadata"]["name"]),
            Text(s.get("phase", "-")),
            _fmt(s.get("worldSize")),
            _fmt(s.get("step")),
            f"{_fmt(ck.get('step'))} ({_age(ck.get('time'), now)})",
            f"{r.get('total', 0)} ({r.get('application', 0)}/{r.get('infrastructure', 0)})",
            Text(s.get("reason", "")),
        ]
        if wide:
            fraction = (s.get("goodput") or {}).get("fraction")
            row += [
                _fmt(s.get("attempt")),
                "-" if fraction is None else f"{100 * fraction:.0f}%",
                _age(s.get("started"), now),
                Text(_last_failure(s)),
            ]
        table.add_row(*row)
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
    if sp := s.get("spares"):
        console.print(
            Text(
                f"spares: {sp.get('wanted', 0)} wanted, {sp.get('running', 0)} running, "
                f"{sp.get('pending', 0)} pending; {sp.get('takeovers', 0)} lost node(s) taken over"
            )
        )
    if lf := s.get("lastFailure"):
        # Text, not markup: a worker's message (say gloo's "[/pytorch/...]") is not rich markup.
        console.print(
            Text(
                f"last failure: {lf.get('cause')} rank={lf.get('rank')} pod={lf.get('pod')} "
                f"node={lf.get('node')} exit={lf.get('exitCode')}: {lf.get('message')}"
            )
        )
    hist = _table(
        "attempts: what each failure cost",
        ("attempt", "world", "resumed from", "ended by", "detect", "recover", "steps lost"),
        wide=("ended by",),
    )
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
        for r in h.get("restartsInPlace") or []:
            lost += r.get("stepsLost") or 0
            hist.add_row(
                f"{h.get('attempt')} in place",
                _fmt(h.get("worldSize")),
                _fmt(r.get("resumedFromStep")),
                (r.get("failure") or {}).get("cause") or "-",
                "-",
                _fmt(_in_place_seconds(r), "s"),
                _fmt(r.get("stepsLost")),
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
    ev = _table("events", ("time", "type", "reason", "message"), wide=("reason", "message"))
    for e in items[-20:]:
        ev.add_row(
            e.get("firstTimestamp") or "",
            Text(e.get("type", "")),
            Text(e.get("reason", "")),
            Text(e.get("message", "")),
        )
    console.print(ev)


def _in_place_seconds(restart: dict[str, Any]) -> float | None:
    """A restart in place's failure to the next generation's first step (status.history)."""
    failed = status.unix_seconds((restart.get("failure") or {}).get("time"))
    back = status.unix_seconds(restart.get("resumed"))
    if not isinstance(failed, int | float) or not isinstance(back, int | float):
        return None
    return round(float(back) - float(failed), 1)


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
    phases = [phase for phase, _ in status.PHASES]
    short = [_SHORT.get(p, p) for p in phases]
    table = _table(
        "time to resume: failure -> first step, by phase (seconds)",
        ("attempt", "after", *short, "total"),
        wide=("after",),
    )
    table.caption = ", ".join(f"{_SHORT[p]}: {p}" for p in phases if p in _SHORT)
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
    if mt := s.get("memoryTier"):
        sealed = mt.get("sealedStep")
        lines.append(
            f"memory tier: every {mt.get('intervalSteps')} steps, last save "
            f"{_sig(mt.get('saveSeconds'))}, sealed step {'-' if sealed is None else sealed}"
        )
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
    failed: list[tuple[str, dict[str, Any], dict[str, Any]]] = []  # (head, entry, failure)
    for h in (job.get("status") or {}).get("history") or []:
        for r in h.get("restartsInPlace") or []:  # restarted in its pods: the attempt went on
            f = r.get("failure") or {}
            where = f"attempt {h.get('attempt')}, restarted in place"
            failed.append((f"{where} (generation {r.get('generation')}): {f.get('cause')}", h, f))
        if h.get("failure") or h.get("cause") not in _PLANNED:
            f = h.get("failure") or {}
            failed.append((f"attempt {h.get('attempt')}: {f.get('cause') or h.get('cause')}", h, f))
    if not failed:
        console.print(Text(f"{namespace}/{name} has not failed"))
        return 0
    for head, h, f in failed:
        n = h.get("attempt")
        console.print(Text(head + (f" at step {f['step']}" if f.get("step") is not None else "")))
        if not f:  # an older operator recorded only the cause
            continue
        _print_failure(console, f)
        if ref := f.get("evidenceRef"):
            rank = f" --rank {f['rank'] * nproc}" if f.get("rank") is not None else ""
            console.print(
                Text(
                    f"  full evidence: configmap/{ref} in {namespace}; logs: "
                    f"fsdpctl -n {namespace} logs {name} --attempt {n}{rank}"
                )
            )
    return 0


def _print_failure(console: Console, f: dict[str, Any]) -> None:
    """The blamed pod, its rank's own words, and the pods that failed only because it did."""
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
    for said in f.get("symptoms") or []:
        console.print(Text(f"  symptom: {said}"))


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


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="default: the kubeconfig context's namespace, else 'default'",
    )
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context", default=None, help="default: the current context")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="every FSDPJob with phase, step, checkpoint and restarts")
    listing.add_argument("-A", "--all-namespaces", action="store_true")
    listing.add_argument(
        "-o", "--output", choices=("table", "wide", "json", "yaml"), default="table"
    )
    describing = sub.add_parser("describe", help="one job: failures, their cost, its Events")
    _job_name(describing)
    describing.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    for verb in ("suspend", "resume"):
        _job_name(sub.add_parser(verb, help=f"{verb} a job (its pods save first)"))
    _job_name(sub.add_parser("why", help="each failed attempt: cause, where, diagnosis"))
    logs_p = sub.add_parser("logs", help="the last log lines a failed attempt's pods left")
    _job_name(logs_p)
    logs_p.add_argument("--attempt", type=int, help="default: the newest with evidence kept")
    logs_p.add_argument("--rank", type=int, help="global rank: only the pod that ran it")
    sub.add_parser("version", help="this fsdpctl, the API it reads and the worker contract")
    completing = sub.add_parser(
        "completion",
        help="the shell code that completes commands, flags and job names",
        description='e.g. in ~/.bashrc: eval "$(fsdpctl completion bash)"',
    )
    completing.add_argument("shell", choices=("bash", "zsh", "fish"))
    return parser


def _job_name(parser: argparse.ArgumentParser) -> None:
    """The job-name argument; the shell completes it from the namespace's FSDPJobs."""
    name = parser.add_argument("name")
    name.completer = _complete_names  # type: ignore[attr-defined]  # argcomplete reads it


def _complete_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Job names for the shell: nothing (never a traceback) when the cluster cannot say."""
    try:
        client = kube.load_client(parsed_args.kubeconfig, context=parsed_args.context)
        namespace = parsed_args.namespace or _context_namespace(
            parsed_args.kubeconfig, parsed_args.context
        )
        jobs = _jobs(kubernetes.client.CustomObjectsApi(client), namespace)
    except Exception:  # a completion must not fail the shell
        return []
    return [j["metadata"]["name"] for j in jobs if j["metadata"]["name"].startswith(prefix)]


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace the kubeconfig's context names, as kubectl uses it; else 'default'."""
    try:
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _version() -> str:
    try:
        mine = importlib.metadata.version("fsdp-operator")
    except importlib.metadata.PackageNotFoundError:
        mine = "unknown"
    return f"fsdpctl {mine} (FSDPJob {api.GROUP}/{api.VERSION}, worker contract {CONTRACT})"


def _dump(doc: Any, fmt: str) -> None:
    """-o json|yaml: the objects as the API server holds them, for scripts."""
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))


def _refusal(exc: ApiException) -> str:
    """An API error in one line: a 403 says which permission is missing (the server names it)."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        message = str(exc.reason)
    if exc.status == 403:
        return f"forbidden: {message} (ask for that permission, or use another --context)"
    if exc.status == 401:
        return f"not logged in to the cluster: {message}"
    return f"the API server answered {exc.status}: {message}"


def main(argv: list[str] | None = None, *, prog: str = "fsdpctl") -> int:
    parser = _parser(prog)
    argcomplete.autocomplete(parser)  # answers the shell's completion request, then exits
    args = parser.parse_args(argv)
    if args.command == "version":
        print(_version())
        return 0
    if args.command == "completion":
        # for the `fsdpctl` executable; kubectl's own completion asks `kubectl_complete-fsdp`
        print(argcomplete.shell_integration.shellcode(["fsdpctl"], shell=args.shell))
        return 0
    try:
        return _run(args)
    except ApiException as exc:
        print(f"{prog}: {_refusal(exc)}", file=sys.stderr)
    except kubernetes.config.ConfigException as exc:
        print(f"{prog}: no usable kubeconfig: {exc}", file=sys.stderr)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        print(f"{prog}: cannot reach the API server: {exc}", file=sys.stderr)
    return 1


def kubectl_main() -> int:
    """`kubectl fsdp ...`: kubectl runs `kubectl-fsdp` from PATH as a plugin."""
    return main(prog="kubectl fsdp")


class _Completed(Exception):
    pass


def _stop(code: int) -> None:
    raise _Completed(code)


def kubectl_complete_main(argv: list[str] | None = None) -> int:
    """`kubectl_complete-fsdp ARG... WORD`: what kubectl's own shell completion runs for `kubectl
    fsdp ARG... WORD<TAB>` (its plugin completion protocol, kubectl >= 1.26): one candidate a
    line, then cobra's directive `:4` (complete no file names). The same candidates as fsdpctl's
    completion: commands, flags, choices and the namespace's job names."""
    words = list(sys.argv[1:] if argv is None else argv) or [""]
    line = " ".join(["kubectl-fsdp", *words])  # the last word is the one being completed
    os.environ.update(
        {"_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line,
         "COMP_POINT": str(len(line))}
    )  # fmt: skip
    for shell_specific in ("_ARGCOMPLETE_SHELL", "_ARGCOMPLETE_DFS"):
        os.environ.pop(shell_specific, None)
    out = io.StringIO()
    with contextlib.suppress(_Completed):  # argcomplete "exits" when it has answered
        argcomplete.autocomplete(
            _parser("kubectl fsdp"), exit_method=_stop, output_stream=out, append_space=False
        )
    print("\n".join([*filter(None, out.getvalue().split("\n")), ":4"]))
    return 0


def _run(args: argparse.Namespace) -> int:
    client = kube.load_client(args.kubeconfig, context=args.context)
    custom = kubernetes.client.CustomObjectsApi(client)
    console = Console()
    namespace = args.namespace or _context_namespace(args.kubeconfig, args.context)
    if args.command == "list":
        scope = None if args.all_namespaces else namespace
        if args.output in ("json", "yaml"):
            _dump({"items": _jobs(custom, scope)}, args.output)
            return 0
        list_jobs(custom, scope, console, wide=args.output == "wide")
        return 0
    if args.command == "describe":
        if args.output != "table":
            job = _read_job(custom, namespace, args.name)
            if job is None:
                return 1
            _dump(job, args.output)
            return 0
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


