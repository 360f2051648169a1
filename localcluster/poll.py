"""Waiting for what a user would see: the one poll loop of the tests and the harness.

A wait asks a probe (the condition as a user would check it: a job's phase, a pod Running, a
claim Bound, a file written) until it answers something truthy, and past its timeout fails with
what it waited for, the probe's last answer and the caller's diagnosis (the job's status, its
Events, the logs), so that a red run says why. The product never imports it (import contracts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimedOut(AssertionError):
    """A wait's condition did not hold in time: a test fails (not errors) with the reason."""


def until(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    every: float = 0.25,
    diagnosis: Callable[[], str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """probe() until it answers something truthy, which is returned. It is asked at least once
    and once more at the deadline (a wait never fails without looking); then TimedOut names
    `what`, the last answer and `diagnosis()`. An exception from probe() ends the wait: a probe
    raises when waiting longer is pointless (the process it watches has exited)."""
    deadline = clock() + timeout
    while True:
        answer = probe()
        if answer:
            return answer
        left = deadline - clock()
        if left <= 0:
            raise TimedOut(_message(what, timeout=timeout, last=answer, diagnosis=diagnosis))
        sleep(min(every, left))


def _message(
    what: str, *, timeout: float, last: object, diagnosis: Callable[[], str] | None
) -> str:
    said = f"timed out after {timeout:g}s waiting for {what}; last={last!r}"
    return f"{said}\n{_diagnose(diagnosis)}" if diagnosis else said


def _diagnose(diagnosis: Callable[[], str]) -> str:
    """The caller's diagnosis, or why there is none: it must never hide the timeout (a cluster
    that broke the wait may break the diagnosis too)."""
    try:
        return diagnosis()
    except Exception as exc:
        return f"(no diagnosis: {type(exc).__name__}: {exc})"
