"""Rank 0's /progress answer (contract.PROGRESS_PATH), which the operator's readiness probe of
rank 0 asks through the kubelet: the evidence of a hang where a NetworkPolicy blocks the scrape."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import prometheus_client as prom
import pytest

from fsdp_worker import contract
from fsdp_worker.telemetry import metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_rank0_serves_metrics_and_says_whether_its_last_step_is_recent() -> None:
    m = metrics.Metrics()
    port = _free_port()
    m.serve(port)
    code, text = _get(port, "/metrics")
    assert code == 200 and contract.METRIC_STEP in text
    code, text = _get(port, f"{contract.PROGRESS_PATH}?within=30")
    assert code == 200 and "no step yet" in text  # just started: the start counts
    m.step.set(12)
    m.last_step_time.set(time.time() - 100)
    code, text = _get(port, f"{contract.PROGRESS_PATH}?within=30")
    assert code == 503 and "step 12" in text and "allowed 30s" in text
    assert _get(port, f"{contract.PROGRESS_PATH}?within=300")[0] == 200
    assert _get(port, f"{contract.PROGRESS_PATH}?within=soon")[0] == 400


@pytest.mark.parametrize(
    ("last", "started", "code"),
    [
        pytest.param(0.0, 1000.0, "200 OK", id="no-step-started-recently"),
        pytest.param(0.0, 900.0, "503 Service Unavailable", id="no-step-started-long-ago"),
        pytest.param(990.0, 0.0, "200 OK", id="recent-step"),
        pytest.param(930.0, 0.0, "503 Service Unavailable", id="old-step"),
        pytest.param(0.0, 900.0, "200 OK", id="no-step-within-the-startup-allowance"),
        pytest.param(0.0, 700.0, "503 Service Unavailable", id="no-step-past-the-startup"),
        pytest.param(930.0, 0.0, "503 Service Unavailable", id="startup-is-not-for-steps"),
    ],
)
def test_progress_counts_from_the_last_step_else_the_start(
    last: float, started: float, code: str, request: pytest.FixtureRequest
) -> None:
    """Before the first step the start counts, against `startup` where the query has one."""
    registry = prom.CollectorRegistry()
    prom.Gauge(contract.METRIC_STEP, "s", registry=registry).set(3)
    prom.Gauge(contract.METRIC_LAST_STEP_TIME, "t", registry=registry).set(last)
    query = "within=60&startup=200" if "startup" in request.node.callspec.id else "within=60"
    assert metrics.progress_answer(registry, query, started, now=1000.0)[0] == code
