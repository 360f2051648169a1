"""Rank 0's Prometheus endpoint: training progress and checkpoint figures (names in contract).

The operator scrapes step and last-step time for `status.step` and hang detection, and the
milestones, step and save seconds and checkpoint interval for time to resume and goodput. Every
rank keeps the gauges; only rank 0 serves them. This module must not compute anything; it
records what it is given (and the time of a milestone); pace.py judges the stragglers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import prometheus_client as prom
from prometheus_client.exposition import ThreadingWSGIServer

from fsdp_worker import contract
from fsdp_worker.contract import interval

log = logging.getLogger(__name__)


class Total:
    """A counter set from the running total the training loop keeps (it only rises)."""

    def __init__(
        self, name: str, doc: str, registry: prom.CollectorRegistry = prom.REGISTRY
    ) -> None:
        self._counter = prom.Counter(name, doc, registry=registry)
        self._total = 0.0
        self._lock = threading.Lock()

    def set(self, total: float) -> None:
        with self._lock:
            if total > self._total:
                self._counter.inc(total - self._total)
                self._total = total

    def inc(self, amount: float) -> None:
        self.set(self._total + amount)

    @property
    def total(self) -> float:
        return self._total


def restarts_in_place(
    registry: prom.CollectorRegistry = prom.REGISTRY, env: Mapping[str, str] = os.environ
) -> None:
    """This process's generation, as the in-place keeper (gang.py) passed it. The earlier
    generations' failure records reach the operator from the gang's coordinator, which it asks
    (signed) beside each scrape: not as metric labels (unbounded, and JSON inside a label)."""
    prom.Gauge(
        contract.METRIC_GENERATION, "Restarts in place before this process.", registry=registry
    ).set(int(env.get(contract.ENV_GENERATION, "0") or 0))


class Metrics:
    """Gauges on a private registry; `serve` starts the HTTP endpoint (rank 0 only)."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> prom.Gauge:
            return prom.Gauge(name, doc, labelnames=labels, registry=self.registry)

        self.step = gauge(contract.METRIC_STEP, "Last completed optimizer step.")
        self.last_step_time = gauge(contract.METRIC_LAST_STEP_TIME, "Unix time of that step.")
        self.loss = gauge(contract.METRIC_LOSS, "Global-batch mean loss of the last step.")
        self.tokens_per_second = gauge(contract.METRIC_TOKENS_PER_SECOND, "All ranks.")
        self.step_seconds = gauge(contract.METRIC_STEP_SECONDS, "Duration of the last step.")
        self.peak_memory = gauge(contract.METRIC_PEAK_MEMORY, "Peak memory of rank 0.")
        self.ckpt_step = gauge(contract.METRIC_CKPT_STEP, "Step of the newest complete checkpoint.")
        self.resumed_from = gauge(
            contract.METRIC_RESUMED_FROM, "Step this process resumed from; -1: it started fresh."
        )
        self.quarantined = gauge(
            contract.METRIC_QUARANTINED, "Checkpoints set aside at resume: 1 per step.", ("step",)
        )
        self.ckpt_seconds = gauge(
            contract.METRIC_CKPT_SAVE_SECONDS, "Last save: blocking and total.", ("kind",)
        )
        self.ckpt_bytes = gauge(contract.METRIC_CKPT_BYTES, "Bytes of the last checkpoint.")
        self.milestone = gauge(
            contract.METRIC_MILESTONE, "Unix time of this process's milestones.", ("milestone",)
        )
        self.steps_run = Total(
            contract.METRIC_STEPS_RUN, "Steps this process completed.", self.registry
        )
        self.step_seconds_sum = Total(
            contract.METRIC_STEP_SECONDS_SUM, "Seconds of those steps.", self.registry
        )
        self.ckpt_blocked = Total(
            contract.METRIC_CKPT_BLOCKED,
            "Seconds training waited on checkpoint saves.",
            self.registry,
        )
        self.interval = gauge(contract.METRIC_INTERVAL, "Steps between checkpoints now.")
        self.interval_input = gauge(
            contract.METRIC_INTERVAL_INPUT, "Inputs of intervalSteps: auto.", ("input",)
        )
        self.memory_step = gauge(contract.METRIC_MEMORY_STEP, "Newest step sealed in memory.")
        self.memory_interval = gauge(contract.METRIC_MEMORY_INTERVAL, "Steps between memory saves.")
        self.memory_save_seconds = gauge(
            contract.METRIC_MEMORY_SAVE_SECONDS, "Seconds the last memory save blocked training."
        )
        self.memory_peer_bytes = gauge(
            contract.METRIC_MEMORY_PEER_BYTES,
            "Bytes of the previous node's rank this rank keeps in memory (peerCopy).",
        )
        self.resumed_from_memory = gauge(
            contract.METRIC_RESUMED_FROM_MEMORY, "1: this process resumed from the memory tier."
        )
        self.rank_compute = gauge(
            contract.METRIC_RANK_COMPUTE, "Local compute per step: slowest ranks.", ("rank",)
        )
        self.rank_wait = gauge(
            contract.METRIC_RANK_WAIT, "Seconds blocked in collectives per step.", ("rank",)
        )
        self.slow_rank = gauge(contract.METRIC_SLOW_RANK, "The rank named slow; -1: none.")
        self.slow_rank.set(-1)
        self.slowdown = gauge(
            contract.METRIC_SLOW_RANK_SLOWDOWN, "Slowest rank's compute over the others' median."
        )
        restarts_in_place(self.registry)
        self.milestones: dict[str, float] = {}  # what `reached` set: for the final message too
        self.loaded_from: tuple[int, bool] | None = None  # what `loaded` said: the final's too

    def sums(self) -> dict[str, object]:
        """This process's totals (contract.sums): rank 0 leaves them in its termination
        message, so the steps after the operator's last scrape still count."""
        return contract.sums(
            steps_run=int(self.steps_run.total),
            train_seconds=self.step_seconds_sum.total,
            blocked_seconds=self.ckpt_blocked.total,
            milestones=self.milestones,
            resumed_from=self.loaded_from[0] if self.loaded_from is not None else None,
            from_memory=self.loaded_from is not None and self.loaded_from[1],
        )

    def loaded(self, step: int | None, *, memory: bool) -> None:
        """The process loaded `step` (None: it starts fresh), from the memory tier or not: the
        LOADED milestone, in metrics and in rank 0's final message."""
        self.loaded_from = (step if step is not None else -1, memory and step is not None)
        self.resumed_from.set(self.loaded_from[0])
        self.resumed_from_memory.set(1 if self.loaded_from[1] else 0)
        self.reached(contract.Milestone.LOADED)

    def reached(self, milestone: contract.Milestone) -> None:
        now = time.time()
        self.milestones[milestone.value] = now
        self.milestone.labels(milestone=milestone.value).set(now)

    def chose(self, choice: interval.Choice) -> None:
        self.interval.set(choice.steps)
        inputs = {
            contract.IntervalInput.SAVE_SECONDS: choice.save_seconds,
            contract.IntervalInput.STEP_SECONDS: choice.step_seconds,
            contract.IntervalInput.MTBF_SECONDS: choice.mtbf_seconds,
            contract.IntervalInput.FAILURES: choice.failures,
        }
        for key, value in inputs.items():
            if value is not None:
                self.interval_input.labels(input=key.value).set(value)

    def paced(
        self, *, shown: Iterable[tuple[str, float, float]], slow_rank: int, slowdown: float
    ) -> None:
        """A window's verdict (pace.Verdict): `shown`, (rank label, compute, wait) of the slowest
        ranks and the median, replaces the last window's series."""
        self.rank_compute.clear()
        self.rank_wait.clear()
        for rank, compute, wait in shown:
            self.rank_compute.labels(rank=rank).set(compute)
            self.rank_wait.labels(rank=rank).set(wait)
        self.slow_rank.set(slow_rank)
        self.slowdown.set(slowdown)

    def serve(self, port: int) -> None:
        if port <= 0:
            return
        serve(port, self.registry)
        log.info("metrics on :%d", port)

    def render(self) -> str:
        return prom.generate_latest(self.registry).decode()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape a second is no news
        pass


def serve(port: int, registry: prom.CollectorRegistry = prom.REGISTRY) -> None:
    """Serve ``registry`` on every path, as prometheus_client does, and ``PROGRESS_PATH`` for
    the kubelet's readiness probe (contract.PROGRESS_PATH), from a daemon thread."""
    metrics_app = prom.make_wsgi_app(registry)
    started = time.time()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != contract.PROGRESS_PATH:
            page: Iterable[bytes] = metrics_app(environ, start_response)
            return page
        code, text = progress_answer(registry, environ.get("QUERY_STRING", ""), started)
        start_response(code, [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode()]

    server = make_server("", port, app, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


def progress_answer(
    registry: prom.CollectorRegistry, query: str, started: float, now: float | None = None
) -> tuple[str, str]:
    """The HTTP status and text of ``GET /progress?within=S&startup=T``: whether the last step
    is at most S seconds old, or before any step, the start at most T (default S). S defaults
    to 60."""
    now = time.time() if now is None else now
    params = urllib.parse.parse_qs(query)
    try:
        within = float(params.get("within", ["60"])[0])
        startup = float(params.get("startup", [str(within)])[0])
    except ValueError:
        return "400 Bad Request", "within, startup: seconds expected\n"
    last = registry.get_sample_value(contract.METRIC_LAST_STEP_TIME) or 0.0
    step = registry.get_sample_value(contract.METRIC_STEP)
    since, what = (last, f"step {step:.0f}") if last > 0 else (started, "start, no step yet")
    within = within if last > 0 else startup
    age = now - since
    text = f"last progress ({what}) {age:.0f}s ago, allowed {within:.0f}s\n"
    return ("200 OK" if age <= within else "503 Service Unavailable"), text
