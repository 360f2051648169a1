"""Rank 0's Prometheus endpoint: training progress and checkpoint figures (names in contract).

The operator scrapes step and last-step time for `status.step` and hang detection, and the
milestones, step and save seconds and checkpoint interval for time to resume and goodput. Every
rank keeps the gauges; only rank 0 serves them. This module must not compute anything; it
records what it is given (and the time of a milestone).
"""

from __future__ import annotations

import logging
import threading
import time

import prometheus_client as prom

from fsdp_worker import contract, interval

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

    def reached(self, milestone: contract.Milestone) -> None:
        self.milestone.labels(milestone=milestone.value).set(time.time())

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

    def serve(self, port: int) -> None:
        if port <= 0:
            return
        prom.start_http_server(port, registry=self.registry)
        log.info("metrics on :%d", port)

    def render(self) -> str:
        return prom.generate_latest(self.registry).decode()
