"""The per-job loops: one asyncio task per FSDPJob that runs a pass when woken, paced, with a
per-job error backoff that grows and resets on success.

`Loops` owns the tasks, their wake-ups, the set of jobs waiting for capacity and the backoff
(the work queue and its rate limiter, kept apart from the reconciler as controller-runtime
does). It knows nothing of kopf or of decisions: a pass is a callable it is given, and what a
pass returns (reconcile.Outcome) says when to look again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from fsdp_operator.io import kube
from fsdp_operator.run import reconcile

log = logging.getLogger(__name__)
Key = tuple[str, str]
Pass = Callable[[str, str], Awaitable[reconcile.Outcome | None]]


@dataclasses.dataclass
class Backoff:
    """Seconds a job's loop waits after a failed pass: `initial`, doubled on each failure in a
    row up to `maximum`, and back to `initial` after a pass succeeds (kopf's error delays and
    controller-runtime's per-item limiter do the same)."""

    initial: float = 1.0
    maximum: float = 300.0
    _failures: dict[Key, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(
                f"error backoff needs 0 < initial ({self.initial}) <= maximum ({self.maximum})"
            )

    def failed(self, key: Key) -> float:
        """Counts a failure of `key`'s pass; returns how long to wait before the next."""
        count = self._failures.get(key, 0)
        self._failures[key] = count + 1
        return min(self.maximum, self.initial * 2.0 ** min(count, 64))

    def succeeded(self, key: Key) -> None:
        self._failures.pop(key, None)

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)


class Loops:
    def __init__(
        self,
        run_pass: Pass,
        *,
        backoff: Backoff,
        min_pause: float = 0.2,
        leading: Callable[[], bool] = lambda: True,
        on_outcome: Callable[[Key, reconcile.Outcome], None] = lambda key, outcome: None,
        on_end: Callable[[Key], None] = lambda key: None,
    ) -> None:
        """`run_pass(namespace, name)` runs one pass (None: the job is gone); `min_pause` is
        the least time between passes of one job however many events arrive; `leading` says
        whether this replica may start loops; `on_end` runs once a job's loop is over."""
        self._run_pass = run_pass
        self.backoff = backoff
        self.min_pause = min_pause
        self._leading = leading
        self._on_outcome = on_outcome
        self._on_end = on_end
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._wakes: dict[Key, asyncio.Event] = {}
        self.wants_nodes: set[Key] = set()
        """Jobs whose last pass waits on node capacity (any node's change may matter)."""

    def __contains__(self, key: object) -> bool:
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def running(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    def keys(self) -> list[Key]:
        return list(self._tasks)

    def poke(self, namespace: str, name: str) -> None:
        """Start the job's loop, or wake it (on the event loop)."""
        if not self._leading():
            return  # a standby: its caches are kept, its loops start when it leads
        key = (namespace, name)
        task = self._tasks.get(key)
        if task is None or task.done():
            self._wakes.pop(key, None)
            # A fresh context: the loop must not keep the kopf event (a whole body, its patch
            # and logger, in kopf's context variables) that happened to start it, for the
            # job's life.
            self._tasks[key] = asyncio.create_task(
                self._loop(key), name=f"fsdpjob/{name}", context=contextvars.Context()
            )
        elif key in self._wakes:
            self._wakes[key].set()

    def wake(self, keys: set[Key]) -> None:
        """Wake the loops of `keys` that run (no loop is started for a job that has none)."""
        for key in keys:
            if key in self._tasks:
                self.poke(*key)

    def cancel_all(self) -> list[Key]:
        """Cancel every loop (leadership lost, or shutting down); returns their keys."""
        for task in list(self._tasks.values()):
            task.cancel()
        return list(self._tasks)

    async def stop(self) -> None:
        self.cancel_all()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _loop(self, key: Key) -> None:
        wake = self._wakes.setdefault(key, asyncio.Event())
        try:
            while True:
                wake.clear()
                try:
                    outcome = await self._run_pass(*key)
                    self.backoff.succeeded(key)
                    pause = self.min_pause
                except kube.NotLeader:
                    return  # leadership is gone: the other loops are being cancelled too
                except Exception:  # a pass failed half-way: the next pass finishes it
                    log.exception("reconcile of %s/%s failed", *key)
                    # Back off for real: watch events must not turn a failing pass (say, a
                    # namespace being deleted refuses every create) into a hot loop that
                    # starves other jobs; and a pass that keeps failing is tried less often.
                    pause = self.backoff.failed(key)
                    outcome = reconcile.Outcome(pause)
                if outcome is None:
                    if not wake.is_set():
                        break  # the job is gone, and no event for its name came during the pass
                    # An event came during the pass: perhaps a new job of the same name,
                    # perhaps a pod of the gone one being collected. Look again, after a pause.
                    delay = pause
                else:
                    delay = outcome.delay
                    self._on_outcome(key, outcome)
                    if outcome.wants_nodes:
                        self.wants_nodes.add(key)
                    else:
                        self.wants_nodes.discard(key)
                await asyncio.sleep(pause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=max(0.0, delay - pause))
        finally:
            if self._tasks.get(key) is asyncio.current_task():  # not replaced by a new job's
                self._tasks.pop(key, None)
                self._wakes.pop(key, None)
                self.wants_nodes.discard(key)
                self.backoff.succeeded(key)
                self._on_end(key)
