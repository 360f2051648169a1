"""One generation of a node's ranks as its keeper sees them: the environment they start with,
and the failure record their end leaves for the gang.

A restarted generation resumes (``auto``) under this attempt's rules and is told the failures
before it; when its ranks fail, the keeper reads their termination message (the first cause
written there, telemetry/termination.py), torchrun's exit code and the container's OOM-kill
count, and decides whether a restart in place may follow. Apart from the keeper (gang.py)
because these are the files and variables the keeper shares with its ranks, not the gang's
protocol: nothing here talks to the coordinator or starts a process.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import time
from collections.abc import Iterable, Mapping
from typing import Any

from fsdp_worker import contract

OOM_EVENTS = "/sys/fs/cgroup/memory.events"


def environment(generation: int, env: Mapping[str, str]) -> dict[str, str]:
    """What `generation`'s ranks get beyond the pod's environment: their generation; from
    generation 1 on, resume ``auto`` under this attempt's rules. (The earlier generations'
    failures reach the operator from the coordinator, which it asks: not through the ranks.)"""
    delta = {contract.ENV_GENERATION: str(generation)}
    if generation > 0:
        delta[contract.ENV_RESUME] = contract.RESUME_AUTO
        delta[contract.ENV_RESUME_RULES] = resume_rules(env).to_json()
    return delta


def resume_rules(env: Mapping[str, str]) -> contract.ResumeRules:
    """What a restarted generation may resume from: this attempt's checkpoints, and earlier
    attempts' only up to the step this attempt started from (which must still be found)."""
    attempt = int(env.get(contract.ENV_ATTEMPT, "1"))
    resume = env.get(contract.ENV_RESUME, "")
    start: int | None = None
    if resume == contract.RESUME_AUTO and env.get(contract.ENV_RESUME_RULES):
        start = contract.ResumeRules.parse(env[contract.ENV_RESUME_RULES]).expect_step
    elif resume:
        name = posixpath.basename(resume.rstrip("/"))
        if name.startswith("step-") and name[5:].isdigit():
            start = int(name[5:])
    return contract.ResumeRules(attempt=attempt, resumed_from_step=start, expect_step=start)


def failure(*, node: int, code: int, started: float, oom_killed: bool) -> dict[str, Any]:
    """This node's failure: its ranks' termination message, torchrun's exit code, and
    whether the kernel killed a process for memory since the generation started."""
    doc: dict[str, Any] = {}
    try:
        with open(termination_log(), encoding="utf-8") as fh:
            text = fh.read(contract.TERMINATION_MESSAGE_MAX_BYTES)
        parsed = json.loads(text) if text.strip() else {}
        doc = parsed if isinstance(parsed, dict) else {}
    except (OSError, ValueError):
        pass
    keep = (*contract.TERMINATION_KEYS, "phase", "memory", contract.MEMORY_STEP_KEY)
    doc = {k: doc[k] for k in keep if k in doc}
    doc.update(node=node, torchrunExitCode=code, time=round(time.time(), 3))
    doc["started"] = round(started, 3)
    if oom_killed:
        doc["reason"] = "OOMKilled"
    return doc


def retryable(failure: dict[str, Any], *, non_retryable: Iterable[int]) -> bool:
    """Whether a restart in place may follow `failure`: not a ConfigError, nor an exit code
    the job (`non_retryable`) or the contract says is permanent."""
    if failure.get("class") == contract.FailureClass.CONFIG.value:
        return False
    code = failure.get("exitCode")
    permanent = {*non_retryable, *contract.NON_RETRYABLE_EXIT_CODES}
    return not (isinstance(code, int) and code in permanent)


def clear_termination_log() -> None:
    """Empty the file before a new generation: its ranks keep the first cause written
    there (termination.py), which must be theirs, not the last generation's."""
    with contextlib.suppress(OSError), open(termination_log(), "w", encoding="utf-8"):
        pass


def oom_kills() -> int:
    """The container's cgroup count of kernel OOM kills (0 when not readable)."""
    try:
        with open(OOM_EVENTS, encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def termination_log() -> str:
    """The pod's termination-message file, which the ranks write and the keeper reads."""
    return os.environ.get(contract.ENV_TERMINATION_LOG) or contract.DEFAULT_TERMINATION_LOG
