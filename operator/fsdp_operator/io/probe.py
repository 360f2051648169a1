"""Rank 0's progress, scraped beside the reconcile passes, never inside one.

A pass says what it wants scraped (`Target`: rank 0's pod and address, how often); one task
scrapes every target when it is due, at most `concurrency` at once, each bounded by a timeout,
so a slow or dead endpoint holds up only its own job's next scrape. A result that changes what a
pass would decide on (step, milestones, checkpoint interval) wakes that job; otherwise passes
take the newest result, once, from `take()`.

The cost follows the detection deadline, not the number of jobs times a fixed poll: a healthy
job is scraped every `min(progressDeadlineSeconds / 4, max_interval)`, a job whose endpoint does
not answer backs off from 1 s to that interval, and a starting job (its resume milestones not
all reported yet) every `startup_interval` while it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import aiohttp

from fsdp_operator.io import gang, kube, metrics, observe, reports
from fsdp_operator.types import names, observed
from fsdp_worker.contract import gangwire

log = logging.getLogger(__name__)
Fetch = Callable[[str, float], Awaitable[str | None]]


@dataclasses.dataclass(frozen=True)
class Gang:
    """An in-place gang whose coordinator (on rank 0's pod, port 29501) is asked beside each
    scrape for its failure records: the one way they reach the operator, typed and signed."""

    job_uid: str
    attempt: int


AskGang = Callable[[str, Gang, float], Awaitable[dict[str, Any] | None]]
"""(rank 0's address, the gang, timeout) -> the coordinator's state answer, or None."""


def gang_asker(client: gang.GangClient, *, port: int = names.GANG_PORT) -> AskGang:
    """The coordinator's `state`, asked with the attempt's key (in a thread: the gang client
    is a blocking socket); None when it does not answer or its answer does not verify."""

    async def ask(ip: str, g: Gang, timeout: float) -> dict[str, Any] | None:
        def once() -> dict[str, Any]:
            doc = {"op": gangwire.Op.STATE}
            where = f"{ip}:{port}"
            return client.ask(where, doc, job_uid=g.job_uid, attempt=g.attempt, timeout=timeout)

        try:
            return await asyncio.to_thread(once)
        except (OSError, ValueError) as exc:
            log.debug("gang coordinator at %s: %s", ip, exc)
            return None

    return ask


class ScrapeError(Exception):
    """A scrape that got no metrics page: what it met (a timeout, a refusal, an HTTP status).
    ``reached``: the pod answered (refused the connection, or sent an HTTP error), so nothing
    stands between the operator and the pod; what failed is the pod's (its server is not up,
    or is gone: a finishing rank 0 stops serving before its pod ends)."""

    def __init__(self, message: str, *, reached: bool = False) -> None:
        super().__init__(message)
        self.reached = reached


@dataclasses.dataclass(frozen=True)
class Target:
    pod: str
    ip: str
    every: float
    """Seconds between scrapes of an answering endpoint."""
    starting: bool = False
    """Scrape at the startup interval while it answers (resume milestones still to come)."""
    gang: Gang | None = None
    """Restarts in place: also ask the gang's coordinator for its failure records."""


SUSPECT_INTERVAL = 1.0
"""Seconds between scrapes of a job with a pod on a node that missed a Lease renewal."""
SWAP_WATCH_INTERVAL = 5.0
"""At most this between scrapes of a job that swaps slow nodes for a spare's
(failurePolicy.swapSlowNodes): rank 0 names a slow rank once per 20-step window, and a
verdict read a whole progress-deadline quarter late is that many steps at the slow pace."""


def interval_for(deadline_seconds: float, max_interval: float) -> float:
    """A quarter of the progress deadline, capped: a hang is seen at most 25 % late."""
    return max(1.0, min(deadline_seconds / 4.0, max_interval))


@dataclasses.dataclass
class _Slot:
    target: Target
    due: float
    failures: int = 0
    unreached: int = 0  # of those in a row, the ones where the pod could not be reached
    error: str = ""  # what the newest failed scrape met
    progress: observed.Progress | None = None
    fresh: bool = False  # not yet handed to a pass
    busy: bool = False


def _key_facts(p: observed.Progress | None) -> object:
    """What a pass decides on: a change here wakes the job."""
    if p is None:
        return None
    generations = tuple(r.generation for r in p.restarts_in_place)
    return p.step, tuple(sorted(p.milestones.items())), p.interval, generations, p.slow_rank


class Prober:
    def __init__(
        self,
        *,
        on_change: Callable[[Hashable], None],
        timeout: float = 1.0,
        concurrency: int = 32,
        startup_interval: float = 1.0,
        fetch: Fetch | None = None,
        ask_gang: AskGang | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._slots: dict[Hashable, _Slot] = {}
        self._on_change = on_change
        self._timeout = timeout
        self._sem = asyncio.Semaphore(concurrency)
        self._startup = startup_interval
        self._fetch = fetch
        self._ask_gang = ask_gang
        self._clock = clock
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._running: set[asyncio.Task[None]] = set()

    def want(self, key: Hashable, target: Target | None) -> None:
        """Called after each pass of a job: what to scrape for it now (None: nothing)."""
        slot = self._slots.get(key)
        if target is None:
            self._slots.pop(key, None)
            return
        if slot is None or (slot.target.pod, slot.target.ip) != (target.pod, target.ip):
            self._slots[key] = _Slot(target, due=self._clock())
            self._wake.set()
            return
        sooner = target.every < slot.target.every
        slot.target = target
        if sooner and not slot.busy:  # wanted more often now (a suspect node): scrape at once
            slot.due = min(slot.due, self._clock())
            self._wake.set()

    def take(self, key: Hashable) -> tuple[str, observed.Progress] | None:
        """The job's newest good scrape, (rank 0's pod name, its progress), if no pass has had
        it yet. Once only: a pass must not read an old sample as news (a checkpoint's step, newer
        than that sample, would flip back and pass for progress)."""
        slot = self._slots.get(key)
        if slot is None or slot.progress is None or not slot.fresh:
            return None
        slot.fresh = False
        return slot.target.pod, slot.progress

    def give_back(self, key: Hashable, taken: tuple[str, observed.Progress]) -> None:
        """A pass that `take`s a scrape and then fails has not seen it: it is news again for
        the next pass, unless a newer scrape has replaced it (an API-server stall must not
        swallow the progress rank 0 made meanwhile)."""
        slot = self._slots.get(key)
        if slot is not None and slot.progress is taken[1] and slot.target.pod == taken[0]:
            slot.fresh = True

    def health(self, key: Hashable) -> observed.ScrapeHealth | None:
        """How the scrapes of the job's rank 0 have gone: how many in a row could not reach
        the pod, the last error, and whether the pod ever served its metrics (None: nothing
        scraped for it yet)."""
        slot = self._slots.get(key)
        if slot is None or (slot.failures == 0 and slot.progress is None):
            return None
        address = f"{slot.target.ip}:{names.METRICS_PORT}"
        answered = slot.progress is not None
        return observed.ScrapeHealth(slot.target.pod, slot.unreached, slot.error, address, answered)

    def forget(self, key: Hashable) -> None:
        self._slots.pop(key, None)

    async def run(self) -> None:
        try:
            while True:
                now = self._clock()
                nxt = now + 5.0
                for key, slot in list(self._slots.items()):
                    if slot.busy:
                        continue
                    if slot.due <= now:
                        slot.busy = True
                        task = asyncio.create_task(self._scrape(key, slot))
                        self._running.add(task)
                        task.add_done_callback(self._running.discard)
                    else:
                        nxt = min(nxt, slot.due)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(0.01, nxt - now))
        finally:
            if self._session is not None:
                await self._session.close()

    async def _get(self, ip: str, timeout: float) -> str:
        """Rank 0's metrics page; ScrapeError says what stood in the way."""
        if self._fetch is not None:
            text = await self._fetch(ip, timeout)
            if text is None:
                raise ScrapeError("no answer")
            return text
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"http://{ip}:{names.METRICS_PORT}/metrics"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status} from {url}", reached=True)
                return (await resp.content.read(1 << 20)).decode("utf-8", "replace")
        except TimeoutError as err:
            raise ScrapeError(f"GET {url}: no answer within {timeout:g}s") from err
        except (aiohttp.ClientError, OSError) as err:
            cause = getattr(err, "os_error", err)
            reached = isinstance(cause, ConnectionRefusedError | ConnectionResetError)
            raise ScrapeError(f"GET {url}: {err or type(err).__name__}", reached=reached) from err

    async def _with_records(self, slot: _Slot, progress: observed.Progress) -> observed.Progress:
        """An in-place gang's failure records, from its coordinator; those seen last stand
        while it does not answer (a moment between generations, a node lost)."""
        g = slot.target.gang
        if g is None or self._ask_gang is None:
            return progress
        answer = await self._ask_gang(slot.target.ip, g, self._timeout)
        if answer is None:
            kept = slot.progress.restarts_in_place if slot.progress is not None else ()
            return dataclasses.replace(progress, restarts_in_place=kept)
        records = reports.in_place_records(answer.get("failures"))
        return dataclasses.replace(progress, restarts_in_place=records)

    async def _scrape(self, key: Hashable, slot: _Slot) -> None:
        try:
            text, error, reached = None, "", False
            async with self._sem:
                try:
                    text = await self._get(slot.target.ip, self._timeout)
                except ScrapeError as err:
                    error, reached = str(err), err.reached
            metrics.SCRAPES.labels("ok" if text is not None else "failed").inc()
            now = self._clock()
            if self._slots.get(key) is not slot:
                return  # the target changed while this scrape ran
            was_blind = slot.unreached >= observed.BLIND_AFTER
            if text is None:
                slot.failures, slot.error = slot.failures + 1, error
                slot.unreached = 0 if reached else slot.unreached + 1
                slot.due = now + min(slot.target.every, 2.0 ** (slot.failures - 1))
                if slot.unreached == observed.BLIND_AFTER or (was_blind and reached):
                    self._on_change(key)  # a pass says so (a condition) and how it judges
                return
            slot.failures, slot.unreached, slot.error = 0, 0, ""
            progress = observe.progress_of(kube.contract_samples(text))
            progress = await self._with_records(slot, progress)
            changed = _key_facts(progress) != _key_facts(slot.progress)
            slot.progress, slot.fresh = progress, True
            starting = slot.target.starting
            slot.due = now + (self._startup if starting else slot.target.every)
            if changed or was_blind:
                self._on_change(key)
        except Exception:  # a scrape is advice: never let one end the prober
            log.exception("scrape for %s failed", key)
            slot.due = self._clock() + slot.target.every
        finally:
            slot.busy = False
            self._wake.set()
