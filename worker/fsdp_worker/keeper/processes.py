"""Finding and killing what a keeper launched, however it is parented now.

torchrun starts each rank in a session of its own, so its process group alone would leave the
ranks running (seen: an orphaned rank 0 kept its metrics port and stepped on), and a rank whose
torchrun died first is reparented to the container's init. So a keeper marks everything it
launches with a token in its environment and finds the processes by /proc. Apart from the
keeper (gang.py) because this is the one part that reads /proc and sends signals, and the worker
tests use `descendants` to check that nothing outlives a run.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence

KEEPER_TOKEN = "FSDP_KEEPER_TOKEN"  # noqa: S105 (the variable's name, not a secret)
"""Set by a keeper in the environment of everything it launches (torchrun, warm launchers),
and so of every rank, forked or exec'd: /proc/<pid>/environ keeps it whoever the parent is."""


def launched_by(token: str) -> list[int]:
    """The processes whose environment carries this keeper's token (a container has its own
    PID namespace: only its processes are visible, and the keeper's user reads their
    environ). Restricted pods cannot make a cgroup per rank; this finds the same set."""
    mark = f"{KEEPER_TOKEN}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if mark in env.split(b"\0"):
            found.append(int(entry))
    return found


def kill_launched(token: str, *, roots: Sequence[int], spare: set[int]) -> list[int]:
    """SIGKILL `roots`, everything below them and everything carrying `token`, but `spare`
    and this process; returns the pids signalled."""
    pids = {*roots, *(d for r in roots for d in descendants(r)), *launched_by(token)}
    doomed = sorted(pids - spare - {os.getpid()})
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return doomed


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (children first found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
