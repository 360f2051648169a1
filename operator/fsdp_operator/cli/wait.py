"""`fsdpctl wait`: block until FSDPJobs meet a condition, as `kubectl wait` does.

`--for=condition=Complete` (or `condition=Failed=False`), `--for=jsonpath='{.status.phase}'=
Succeeded` (or a path alone: it selects something), `--for=delete`; `--timeout` as kubectl
spells durations (30s, 5m, 1h30m). Polls the API through cluster.py; the clock and the sleep are
passed in, so the loop is tested without waiting.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from fsdp_operator.cli import cluster, jsonpath, printers
from fsdp_operator.types import api

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
WEEK = 7 * 24 * 3600.0


class Kind(enum.StrEnum):
    CONDITION = "condition"
    JSONPATH = "jsonpath"
    DELETE = "delete"


@dataclasses.dataclass(frozen=True)
class WaitFor:
    """One `--for`: what to read (a condition type, a JSONPath) and the value it must have
    (None for a JSONPath: it must select something)."""

    kind: Kind
    path: str = ""
    want: str | None = None


def _refuse(value: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(
        f"--for={value!r}: allowed are condition=TYPE[=STATUS] (e.g. condition=Complete), "
        "jsonpath='{PATH}'[=VALUE] (e.g. jsonpath='{.status.phase}'=Succeeded) and delete"
    )


def parse_for(value: str) -> WaitFor:
    """`--for VALUE` (argparse's type)."""
    kind, _, rest = value.partition("=")
    if kind == Kind.DELETE and not rest:
        return WaitFor(Kind.DELETE)
    if kind == Kind.CONDITION and rest:
        ctype, eq, want = rest.partition("=")
        if ctype and (want or not eq):
            return WaitFor(Kind.CONDITION, ctype, want or "True")
    if kind == Kind.JSONPATH and rest:
        if rest.startswith("{") and "}" in rest:
            close = rest.rindex("}") + 1
            path, after = rest[:close], rest[close:]
            if after in ("",) or after.startswith("="):
                return WaitFor(Kind.JSONPATH, path, after[1:] if after else None)
        else:
            path, eq, want = rest.partition("=")
            return WaitFor(Kind.JSONPATH, path, want if eq else None)
    raise _refuse(value)


def parse_timeout(value: str) -> float:
    """`--timeout`: 30s, 5m, 1h30m, 500ms, or seconds; negative waits a week (as kubectl)."""
    sign, body = (-1.0, value[1:]) if value.startswith("-") else (1.0, value)
    try:
        return WEEK if sign < 0 else float(body)
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise argparse.ArgumentTypeError(
            f"--timeout {value!r}: a duration such as 30s, 5m or 1h30m is allowed"
        )
    return WEEK if sign < 0 else sum(float(n) * _UNIT[u] for n, u in parts)


def met(job: dict[str, Any] | None, wait_for: WaitFor) -> bool:
    """Whether `job` (None: it does not exist) meets `wait_for`. Condition types and statuses
    compare without case, as kubectl compares them."""
    if wait_for.kind is Kind.DELETE or job is None:
        return job is None and wait_for.kind is Kind.DELETE
    if wait_for.kind is Kind.CONDITION:
        return any(
            str(c.get("type", "")).lower() == wait_for.path.lower()
            and str(c.get("status", "")).lower() == str(wait_for.want).lower()
            for c in (job.get("status") or {}).get("conditions") or []
        )
    found = jsonpath.evaluate(job, wait_for.path.removeprefix("{").removesuffix("}"))
    if wait_for.want is None:
        return bool(found)
    return any(jsonpath.text(v) == wait_for.want for v in found)


@dataclasses.dataclass(frozen=True)
class Clock:
    """What the loop reads time with and waits with (a test passes its own)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    interval: float = 1.0


def wait(
    custom: Any,
    namespace: str | None,
    args: argparse.Namespace,
    clock: Clock | None = None,
    *,
    say: bool = True,
) -> int:
    """Polls the jobs `args` names (or selects) until each meets `args.wait_for`: 0 then, 1
    when one does not exist (and the wait is not for its deletion) or the timeout passes."""
    clock = clock or Clock()
    deadline = clock.now() + args.timeout
    jobs = _fetch(custom, namespace, args.selector)
    pending = list(args.names) or sorted(jobs)
    if not pending:
        print("error: no matching resources found", file=sys.stderr)
        return 1
    while True:
        if missing := _missing(pending, jobs, args.wait_for):
            print(
                f'Error from server (NotFound): {api.PLURAL} "{missing}" not found', file=sys.stderr
            )
            return 1
        pending = _report(pending, jobs, args.wait_for, say=say)
        if not pending:
            return 0
        if clock.now() >= deadline:
            for job_name in pending:
                print(
                    f"error: timed out waiting for the condition on {api.PLURAL}/{job_name}",
                    file=sys.stderr,
                )
            return 1
        clock.sleep(clock.interval)
        jobs = _fetch(custom, namespace, args.selector)


def _fetch(custom: Any, namespace: str | None, selector: str | None) -> dict[str, Any]:
    """The jobs in scope by name: one list a poll, whether names or a selector chose them."""
    return {j["metadata"]["name"]: j for j in cluster.jobs(custom, namespace, selector)}


def _missing(pending: list[str], jobs: dict[str, Any], wait_for: WaitFor) -> str | None:
    """A job asked for by name that does not exist, unless the wait is for deletions."""
    if wait_for.kind is Kind.DELETE:
        return None
    return next((n for n in pending if n not in jobs), None)


def _report(
    pending: list[str], jobs: dict[str, Any], wait_for: WaitFor, *, say: bool = True
) -> list[str]:
    """Prints the jobs that now meet the condition, as kubectl does (unless not to `say`);
    returns the others."""
    still = []
    for job_name in pending:
        job = jobs.get(job_name)
        if not met(job, wait_for):
            still.append(job_name)
            continue
        said = "deleted" if wait_for.kind is Kind.DELETE else "condition met"
        if say:
            print(f"{printers.name({'metadata': {'name': job_name}})} {said}")
    return still
