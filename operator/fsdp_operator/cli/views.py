"""`fsdpctl list` and `describe`: the tables a user reads, from the status as written.

Every value comes from the status model read as written (documents.py), so any field may be
None: a view shows `-` for what the status does not say. Renders with rich; reads the API only
through cluster.py; makes no decisions.
"""

from __future__ import annotations

import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fsdp_operator.cli import cluster, documents
from fsdp_operator.types import status

# Phase names as column headers short enough for 80 columns (the caption spells them out).
_SHORT = {"teardown": "down", "schedule": "sched", "rendezvous": "rdzv", "firstStep": "step1"}


def table(title: str, columns: tuple[str, ...], *, wide: tuple[str, ...] = ()) -> Table:
    """A table that stays readable in 80 columns: no vertical rules, one space between columns,
    headers never cut; only the `wide` columns (names, messages) fold their cells."""
    made = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    for col in columns:
        if col in wide:
            made.add_column(col, overflow="fold", min_width=max(len(col), 8))
        else:
            made.add_column(col, no_wrap=True, min_width=len(col))
    return made


def _age(at: float | None, now: float) -> str:
    """How long ago a status time was."""
    if at is None:
        return "-"
    secs = int(now - at)
    return (
        f"{secs // 3600}h{secs % 3600 // 60:02d}m"
        if secs >= 3600
        else f"{secs // 60}m{secs % 60:02d}s"
    )


def fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}{suffix}"
    return f"{value}{suffix}"


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
_WIDE_COLUMNS = ("attempt", "goodput", "done", "eta", "age", "last failure")


def _duration(seconds: int | None) -> str:
    """A time to go, as _age writes a time gone: `1h02m`, `11m40s`."""
    return "-" if seconds is None else _age(0.0, float(seconds))


def _progress(s: status.FSDPJobStatus) -> tuple[str, str]:
    """status.progress as `65.0%` and its estimate to the last step (`-`: not known yet)."""
    p = s.progress
    if p is None:
        return "-", "-"
    return fmt(p.percent, "%"), _duration(p.estimated_seconds_remaining)


def _last_failure(s: status.FSDPJobStatus) -> str:
    """-o wide: the latest failure, where: `OOMKilled pod 3 (gpu-node-7)`."""
    failure = s.last_failure
    if failure is None:
        return "-"
    said = str(failure.cause or "?")
    if failure.rank is not None:
        said += f" pod {failure.rank}"
    return said + (f" ({failure.node})" if failure.node else "")


def _restarts(s: status.FSDPJobStatus) -> str:
    """`total (application/infrastructure)`: what each restart budget has spent."""
    r = s.restarts or status.Restarts()
    return f"{r.total or 0} ({r.application or 0}/{r.infrastructure or 0})"


def _list_row(job: dict[str, Any], now: float, *, wide: bool) -> list[str | Text]:
    s = documents.job_status(job)
    ck = s.last_checkpoint
    row: list[str | Text] = [
        Text(job["metadata"]["namespace"]),
        Text(job["metadata"]["name"]),
        Text(s.phase or "-"),
        fmt(s.world_size),
        fmt(s.step),
        f"{fmt(ck.step if ck else None)} ({_age(ck.time if ck else None, now)})",
        _restarts(s),
        Text(s.reason or ""),
    ]
    if wide:
        fraction = s.goodput.fraction if s.goodput else None
        row += [
            fmt(s.attempt),
            "-" if fraction is None else f"{100 * fraction:.0f}%",
            *_progress(s),
            _age(s.started, now),
            Text(_last_failure(s)),
        ]
    return row


def list_jobs(
    custom: Any,
    namespace: str | None,
    console: Console,
    *,
    wide: bool = False,
    selector: str | None = None,
) -> None:
    print_jobs(cluster.jobs(custom, namespace, selector), console, wide=wide)


def print_jobs(
    jobs: list[dict[str, Any]], console: Console, *, wide: bool = False, header: bool = True
) -> None:
    """The jobs as a table; `header=False` for the rows `get --watch` adds one change at a
    time."""
    now = datetime.datetime.now(datetime.UTC).timestamp()
    columns, folded = _LIST_COLUMNS, ("namespace", "name", "reason", "last failure")
    if wide:  # more than 80 columns: what `kubectl get -o wide` users look for next
        columns += _WIDE_COLUMNS
    listing = table("FSDPJobs" if header else "", columns, wide=folded)
    listing.show_header = header
    if header:
        listing.caption = "ckpt: newest sealed step (its age); restarts: total (application/infra)"
    else:
        listing.title = None
    for job in jobs:
        listing.add_row(*_list_row(job, now, wide=wide))
    console.print(listing)


def describe(custom: Any, core: Any, namespace: str, name: str, console: Console) -> None:
    s = documents.job_status(cluster.job(custom, namespace, name))
    head = Text(f"{namespace}/{name}", style="bold")
    head.append(f"  phase={s.phase}  attempt={s.attempt}  world={s.world_size}  step={s.step}")
    done, eta = _progress(s)
    head.append(f"  done={done}  eta={eta}")
    console.print(head)
    console.print(Text(_checkpoints_line(s)))
    if sp := s.spares:
        console.print(
            Text(
                f"spares: {sp.wanted or 0} wanted, {sp.running or 0} running, "
                f"{sp.pending or 0} pending; {sp.takeovers or 0} lost node(s) taken over"
            )
        )
    if lf := s.last_failure:
        # Text, not markup: a worker's message (say gloo's "[/pytorch/...]") is not rich markup.
        console.print(
            Text(
                f"last failure: {lf.cause} rank={lf.rank} pod={lf.pod} "
                f"node={lf.node} exit={lf.exit_code}: {lf.message}"
            )
        )
    history = s.history or []
    console.print(_attempts_table(history))
    console.print(f"total steps redone after restarts: {_steps_redone(history)}")
    console.print(_resume_table(history))
    for line in cost_lines(s):
        console.print(Text(line))
    console.print(_events_table(cluster.events(core, namespace, name)))


def _attempts_table(history: list[status.HistoryEntry]) -> Table:
    """Each attempt, and each restart in place inside it: what ended it and what it cost."""
    attempts = table(
        "attempts: what each failure cost",
        ("attempt", "world", "resumed from", "ended by", "detect", "recover", "steps lost"),
        wide=("ended by",),
    )
    for h in history:
        ended_by = h.cause or ("running" if h.ended is None else "-")
        attempts.add_row(
            str(h.attempt),
            fmt(h.world_size),
            fmt(h.resumed_from_step),
            ended_by,
            fmt(h.detect_seconds, "s"),
            fmt(h.recover_seconds, "s"),
            fmt(h.steps_lost),
        )
        for r in h.restarts_in_place or []:
            attempts.add_row(
                f"{h.attempt} in place",
                fmt(h.world_size),
                fmt(r.resumed_from_step),
                (r.failure.cause if r.failure else None) or "-",
                "-",
                fmt(_in_place_seconds(r), "s"),
                fmt(r.steps_lost),
            )
    return attempts


def _steps_redone(history: list[status.HistoryEntry]) -> int:
    """Steps trained again after restarts: the attempts' and their restarts in place."""
    lost = 0
    for h in history:
        lost += h.steps_lost or 0
        lost += sum(r.steps_lost or 0 for r in h.restarts_in_place or [])
    return lost


def _events_table(events: list[dict[str, Any]]) -> Table:
    """The newest 20 Events about the job."""
    shown = table("events", ("time", "type", "reason", "message"), wide=("reason", "message"))
    for e in events[-20:]:
        shown.add_row(
            e.get("firstTimestamp") or "",
            Text(e.get("type", "")),
            Text(e.get("reason", "")),
            Text(e.get("message", "")),
        )
    return shown


def _in_place_seconds(restart: status.InPlaceRestart) -> float | None:
    """A restart in place's failure to the next generation's first step (status.history)."""
    failed = restart.failure.time if restart.failure else None
    if failed is None or restart.resumed is None:
        return None
    return round(restart.resumed - failed, 1)


def _checkpoints_line(s: status.FSDPJobStatus) -> str:
    """The newest checkpoint, and what the current attempt loads (or its pods choose)."""
    last = (s.last_checkpoint.path if s.last_checkpoint else None) or "-"
    where = s.resume_path
    if where == "auto":
        loads = "the checkpoint its pods choose (the operator cannot read them)"
    else:
        loads = where or "nothing (started fresh)"
    return (
        f"checkpoints: newest sealed step {fmt(s.sealed_step)} ({last}); "
        f"attempt {fmt(s.attempt)} loads {loads}"
    )


def _resume_table(history: list[status.HistoryEntry]) -> Table:
    """Each attempt's way back to training, phase by phase (status.history[].timeline)."""
    phases = [phase for phase, _ in status.PHASES]
    short = [_SHORT.get(p, p) for p in phases]
    resumes = table(
        "time to resume: failure -> first step, by phase (seconds)",
        ("attempt", "after", *short, "total"),
        wide=("after",),
    )
    resumes.caption = ", ".join(f"{_SHORT[p]}: {p}" for p in phases if p in _SHORT)
    for h in history:
        tl = h.timeline
        if tl is None:
            continue
        secs = dict(status.breakdown(tl))
        resumes.add_row(
            str(h.attempt),
            str(tl.cause) if tl.cause else "(start)",
            *(fmt(secs.get(p)) for p in phases),
            fmt(status.time_to_resume(tl)),
        )
    return resumes


def _sig(seconds: float | None) -> str:
    return "unmeasured" if seconds is None else f"{seconds:.3g}s"


def cost_lines(s: status.FSDPJobStatus) -> list[str]:
    """What the job's time went to, how often it saves and why: goodput, the checkpoint
    interval, the memory tier (each only when the status has it)."""
    lines = []
    if g := s.goodput:
        lines.append(_goodput_line(g))
    if ci := s.checkpoint_interval:
        how = "fixed"
        if ci.auto:
            mtbf = ci.mtbf_seconds
            hours = f"{mtbf / 3600:.2f}h" if mtbf else "-"
            how = (
                f"auto: save {_sig(ci.save_seconds)}, step {_sig(ci.step_seconds)}, "
                f"MTBF {hours} ({ci.failures or 0} failures)"
            )
        lines.append(f"checkpoint interval: {ci.steps} steps ({how})")
    if mt := s.memory_tier:
        sealed = mt.sealed_step
        lines.append(
            f"memory tier: every {mt.interval_steps} steps, last save "
            f"{_sig(mt.save_seconds)}, sealed step {'-' if sealed is None else sealed}"
        )
    if slow := s.slow_rank:  # the whole gang runs at its pace
        where = f" (pod {slow.pod or '?'} on node {slow.node or '?'})"
        lines.append(f"slow rank: {slow.rank}{where} computes {slow.slowdown:.2f}x the others")
    if s.suspect_nodes:  # a kubelet silent under a gang that trains on
        lines.append(f"suspect nodes (Lease silent, job training): {', '.join(s.suspect_nodes)}")
    return lines


def _goodput_line(g: status.Goodput) -> str:
    lost = g.lost_seconds or {}
    split = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(lost.items(), key=lambda kv: -kv[1]))
    return (
        f"goodput {100 * (g.fraction or 0.0):.1f}%: {g.productive_seconds or 0.0:.1f}s "
        f"of {g.wall_seconds or 0.0:.1f}s trained steps that count; lost: {split or '-'} "
        f"(of which steps redone {g.redone_seconds or 0.0:.1f}s)"
    )
