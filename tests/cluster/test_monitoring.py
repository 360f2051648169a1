"""What a platform's Prometheus gets: metric pages promtool accepts, alert rules it unit-tests.

`promtool` is Debian's (package `prometheus`, installed by `make packages`). The rules are the
chart's, rendered by the real helm with the chart's default thresholds; each alert is tested
firing and, on a near miss, not firing.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import prometheus_client as prom
import yaml

from fsdp_operator.io import metrics as operator_metrics
from fsdp_worker import contract
from fsdp_worker.contract import interval
from fsdp_worker.telemetry import metrics as worker_metrics
from harness import prometheus, stack


def _promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_operators_page_passes_promtool_check_metrics() -> None:
    operator_metrics.count_phase("team-m", "llm", "Running")
    operator_metrics.count_failure("team-m", "llm", "Crash")
    operator_metrics.CKPT_TIME.labels("team-m", "llm").set(1_700_000_000)
    operator_metrics.GOODPUT.labels("team-m", "llm").set(0.9)
    operator_metrics.RECONCILE_ERRORS.labels("Conflict").inc()
    try:
        page = prom.generate_latest(prom.REGISTRY).decode()
        assert "fsdpjob_job_failures_total{" in page and "fsdpjob_job_phase{" in page
        _promtool("check", "metrics", stdin=page)
    finally:
        operator_metrics.forget("team-m", "llm")


def test_the_workers_page_passes_promtool_check_metrics() -> None:
    m = worker_metrics.Metrics()
    m.step.set(12)
    m.steps_run.set(12)
    m.step_seconds_sum.set(3.0)
    m.ckpt_blocked.set(0.5)
    m.reached(contract.Milestone.FIRST_STEP)
    m.ckpt_seconds.labels(kind="blocking").set(0.2)
    m.chose(
        interval.Choice(
            steps=50,
            auto=True,
            save_seconds=2.0,
            step_seconds=0.25,
            mtbf_seconds=3600.0,
            failures=1,
        )
    )
    page = m.render()
    assert "fsdp_train_steps_run_total 12.0" in page
    _promtool("check", "metrics", stdin=page)


# --- the chart's alert rules -------------------------------------------------------------


def _rules() -> dict[str, Any]:
    docs = stack.render_chart(
        values=["metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=prom"]
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    return dict(rule["spec"])


def _alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in spec["groups"] for r in group["rules"]}


def _expected(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """An alert as promtool reports it: the series' labels, then the rule's over them, labels
    and annotations with `$labels` filled in (the rules use no other template)."""

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)

    annotations = {k: fill(v) for k, v in rule.get("annotations", {}).items()}
    own = {k: fill(v) for k, v in rule.get("labels", {}).items()}
    return {"exp_labels": {**labels, **own}, "exp_annotations": annotations}


# As the operator's scrape labels them: `namespace` is the operator's, job_namespace the job's.
JOB = {"namespace": "fsdp-system", "job_namespace": "team-a", "job_name": "llm"}
OTHER = {"namespace": "fsdp-system", "job_namespace": "team-b", "job_name": "calm"}
KEY = {"job_namespace": "team-a", "job_name": "llm"}  # what `by (job_namespace, job_name)` keeps


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _goodput(labels: dict[str, str], productive: str, wall: str) -> list[dict[str, str]]:
    """The goodput totals a job's status keeps (productive and wall seconds), as series."""
    return [
        _series("fsdpjob_goodput_productive_seconds", labels, productive),
        _series("fsdpjob_goodput_wall_seconds", labels, wall),
    ]


def _cases(alerts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """(input series, alert, evaluation time, the alerts expected then): each alert fires on
    its condition and not on a near miss beside it."""

    def case(
        alert: str, at: str, series: list[dict[str, str]], firing: list[dict[str, str]]
    ) -> dict[str, Any]:
        expected = [_expected(alerts[alert], labels) for labels in firing]
        return {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}],
        }

    running = _series("fsdpjob_job_phase", {**JOB, "phase": "Running"}, "1x120")
    finished = _series("fsdpjob_job_phase", {**OTHER, "phase": "Succeeded"}, "1x120")
    return [
        # no replica leads (both standing by), then one does
        case(
            "FSDPOperatorNoLeader",
            "5m",
            [
                _series("fsdpjob_operator_leader", {"pod": "op-0"}, "0x10"),
                _series("fsdpjob_operator_leader", {"pod": "op-1"}, "0x10"),
            ],
            [{}],
        ),
        case(
            "FSDPOperatorNoLeader",
            "5m",
            [
                _series("fsdpjob_operator_leader", {"pod": "op-0"}, "0x10"),
                _series("fsdpjob_operator_leader", {"pod": "op-1"}, "1x10"),
            ],
            [],
        ),
        # no operator scraped at all is no leader too
        case("FSDPOperatorNoLeader", "5m", [_series("up", {"pod": "x"}, "1x10")], [{}]),
        # 10 failed passes a minute for 20 minutes, against 1 every 10 minutes
        case(
            "FSDPOperatorReconcileErrors",
            "20m",
            [
                _series("fsdpjob_reconcile_errors_total", {"reason": "Forbidden"}, "0+10x30"),
                _series("fsdpjob_reconcile_errors_total", {"reason": "Conflict"}, "0+0.1x30"),
            ],
            [{"reason": "Forbidden"}],
        ),
        # most scrapes fail (a default-deny NetworkPolicy), then most succeed
        case(
            "FSDPOperatorHangDetectionBlind",
            "25m",
            [
                _series("fsdpjob_operator_scrapes_total", {"result": "failed"}, "0+10x30"),
                _series("fsdpjob_operator_scrapes_total", {"result": "ok"}, "0+1x30"),
            ],
            [{}],
        ),
        case(
            "FSDPOperatorHangDetectionBlind",
            "25m",
            [
                _series("fsdpjob_operator_scrapes_total", {"result": "failed"}, "0+1x30"),
                _series("fsdpjob_operator_scrapes_total", {"result": "ok"}, "0+10x30"),
            ],
            [],
        ),
        # llm fails every 5 minutes; calm failed once and then trained
        case(
            "FSDPJobRestartStorm",
            "20m",
            [
                _series(
                    "fsdpjob_job_failures_total",
                    {**JOB, "cause": "Crash"},
                    "1 1 1 1 1 2 2 2 2 2 3 3 3 3 3 4 4 4 4 4 5",
                ),
                _series("fsdpjob_job_failures_total", {**OTHER, "cause": "OOMKilled"}, "1x20"),
            ],
            [KEY],
        ),
        # a running job at 50% goodput for 40 minutes; a finished one at 50% is left alone
        case(
            "FSDPJobLowGoodput",
            "40m",
            [
                *_goodput(JOB, "0+30x60", "0+60x60"),
                running,
                *_goodput(OTHER, "0+30x60", "0+60x60"),
                finished,
            ],
            [JOB],
        ),
        case("FSDPJobLowGoodput", "40m", [*_goodput(JOB, "0+57x60", "0+60x60"), running], []),
        # day-10 collapse: 95% for 10 h, then 20% for 2 h. The lifetime ratio is still 0.825;
        # the last 6 h are at 0.7
        case(
            "FSDPJobLowGoodput",
            "12h",
            [
                *_goodput(JOB, "0+57x600 34212+12x119", "0+60x720"),
                _series("fsdpjob_job_phase", {**JOB, "phase": "Running"}, "1x720"),
            ],
            [JOB],
        ),
        # preempted for 5 h, then 1 h at 95%: the lifetime ratio is 0.16, but a planned stop
        # is not the job's goodput
        case(
            "FSDPJobLowGoodput",
            "6h",
            [
                *_goodput(JOB, "0x300 57+57x59", "0+60x360"),
                _series("fsdpjob_lost_seconds", {**JOB, "cause": "Preempted"}, "0+60x300 18000x59"),
                _series("fsdpjob_job_phase", {**JOB, "phase": "Running"}, "_x300 1x60"),
            ],
            [],
        ),
        # llm sealed its last checkpoint at time 0; calm, finished, too; at 70 minutes only
        # the running job is told
        case(
            "FSDPJobCheckpointTooOld",
            "70m",
            [
                _series("fsdpjob_checkpoint_timestamp_seconds", JOB, "0x80"),
                running,
                _series("fsdpjob_checkpoint_timestamp_seconds", OTHER, "0x80"),
                finished,
            ],
            [JOB],
        ),
        # one that seals every 10 minutes never is
        case(
            "FSDPJobCheckpointTooOld",
            "70m",
            [
                _series(
                    "fsdpjob_checkpoint_timestamp_seconds",
                    JOB,
                    " ".join(str(600 * (i // 10)) for i in range(80)),
                ),
                running,
            ],
            [],
        ),
        # running 2 h 10 m and never sealed: told; one that sealed, or finished, is not
        case(
            "FSDPJobFirstCheckpointNeverSealed",
            "130m",
            [
                # a restart between: the phase changes, the hours count on
                _series("fsdpjob_job_phase", {**JOB, "phase": "Running"}, "1x60 _x5 1x100"),
                _series("fsdpjob_job_phase", {**JOB, "phase": "Restarting"}, "_x60 1x5"),
                _series("fsdpjob_job_phase", {**OTHER, "phase": "Running"}, "1x200"),
                _series("fsdpjob_checkpoint_timestamp_seconds", OTHER, "_x30 1800x170"),
                finished,
            ],
            [KEY],
        ),
        case(
            "FSDPJobFirstCheckpointNeverSealed",
            "110m",
            [_series("fsdpjob_job_phase", {**JOB, "phase": "Running"}, "1x200")],
            [],
        ),
        # Pending, then Queued by Kueue: 90 minutes waiting; the running one is not told
        case(
            "FSDPJobStuckQueued",
            "90m",
            [
                _series("fsdpjob_job_phase", {**JOB, "phase": "Pending"}, "1x20"),
                _series("fsdpjob_job_phase", {**JOB, "phase": "Queued"}, "_x20 1x100"),
                _series("fsdpjob_job_phase", {**OTHER, "phase": "Running"}, "1x120"),
            ],
            [KEY],
        ),
        case(
            "FSDPJobStuckQueued",
            "50m",
            [_series("fsdpjob_job_phase", {**JOB, "phase": "Queued"}, "1x100")],
            [],
        ),
        case(
            "FSDPJobFailed",
            "5m",
            [_series("fsdpjob_job_phase", {**JOB, "phase": "Failed"}, "1x10"), finished],
            [{**JOB, "phase": "Failed"}],
        ),
    ]


def test_the_charts_alerts_pass_promtool_check_and_fire_when_they_should(
    tmp_path: Path,
) -> None:
    spec = _rules()
    alerts = _alerts(spec)
    assert set(alerts) == {
        "FSDPOperatorNoLeader",
        "FSDPOperatorReconcileErrors",
        "FSDPOperatorHangDetectionBlind",
        "FSDPJobRestartStorm",
        "FSDPJobLowGoodput",
        "FSDPJobCheckpointTooOld",
        "FSDPJobFirstCheckpointNeverSealed",
        "FSDPJobStuckQueued",
        "FSDPJobFailed",
    }
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    cases = _cases(alerts)
    assert {c["alert_rule_test"][0]["alertname"] for c in cases} == set(alerts)
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    out = _promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert "SUCCESS" in out


def test_alert_thresholds_are_values() -> None:
    docs = stack.render_chart(
        values=[
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.thresholds.goodputBelow=0.6",
            "metrics.prometheusRule.thresholds.checkpointOlderThanSeconds=7200",
        ]
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    alerts = _alerts(rule["spec"])
    assert ") < 0.6 and on" in alerts["FSDPJobLowGoodput"]["expr"]
    assert "> 7200" in alerts["FSDPJobCheckpointTooOld"]["expr"]
    refused = stack.helm_template(values=["metrics.prometheusRule.thresholds.goodputBelow=1.5"])
    assert refused.returncode != 0 and "goodputBelow" in refused.stderr


def test_the_charts_monitors_make_a_prometheus_configuration_promtool_accepts(
    tmp_path: Path,
) -> None:
    """harness.prometheus turns the chart's PodMonitors into scrape jobs (the e2e suite's
    Prometheus runs on them); the result is a configuration Prometheus accepts."""
    docs = stack.render_chart(
        values=["metrics.podMonitor.enabled=true", "metrics.workerPodMonitor.enabled=true"]
    )
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {stack.OP_SA, f"{stack.OP_SA}-workers"}
    jobs = [prometheus.scrape_job(m, tmp_path / "pods.json", "15s") for m in monitors]
    workers = next(j for j in jobs if j["job_name"].endswith("-workers"))
    targets = {r.get("target_label") for r in workers["relabel_configs"]}
    assert {"job_namespace", "job_name"} <= targets, "worker series get the operator's job labels"
    config = {"scrape_configs": jobs}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    _promtool("check", "config", "prometheus.yml", cwd=tmp_path)


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    docs = stack.render_chart(values=["metrics.dashboard.enabled=true"])
    (board,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(board["data"]["fsdp-operator.json"])
    assert dashboard["uid"] == "fsdp-operator"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "cluster", "job_namespace", "job_name"}
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = {p["title"] for p in panels}
    for wanted in (
        "Phase",
        "Step rate",
        "Goodput",
        "Time to resume by phase (p50)",
        "Lost time by cause",
        "Checkpoint age",
        "Checkpoint interval",
        "Leader",
        "Reconcile passes",
        "API requests",
        "Reconcile errors",
    ):
        assert wanted in titles, wanted
    for wanted in ("Queue wait (Kueue)", "GPU utilization (DCGM)", "GPU memory used (DCGM)"):
        assert wanted in titles, wanted
    for panel in panels:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
        # one Grafana for several clusters: every query follows the cluster variable
        for target in panel["targets"]:
            assert 'cluster=~"$cluster"' in target["expr"], (panel["title"], target["expr"])
        assert panel["datasource"]["uid"] == "${datasource}"


def _panel_expr(title: str) -> str:
    """A dashboard panel's query with its template variables set to KEY's job."""
    dashboard = json.loads((stack.ROOT / "charts/fsdp-operator/files/dashboard.json").read_text())
    (expr,) = [t["expr"] for p in dashboard["panels"] if p["title"] == title for t in p["targets"]]
    return (
        str(expr)
        .replace("$cluster", ".*")
        .replace("$job_namespace", KEY["job_namespace"])
        .replace("$job_name", KEY["job_name"])
    )


def _step_rate_case(expr: str) -> dict[str, Any]:
    """Rank 0 of a job 100,000 steps in, one step a second, restarted in place at minute 10:
    its new process counts steps run from 0 again and its step gauge goes back to the sealed
    step (20 steps). Five minutes on, the gang still runs one step a second."""
    run = "0+60x10 60+60x10"  # a new process: the counter starts again (a reset)
    step = "100000+60x10 99980+60x10"  # the gauge steps back to the resume point
    return {
        "interval": "1m",
        "input_series": [
            _series("fsdp_train_steps_run_total", {**KEY, "rank": "0"}, run),
            _series("fsdp_train_step", {**KEY, "rank": "0"}, step),
        ],
        "promql_expr_test": [
            {
                "expr": expr,
                "eval_time": "13m",
                "exp_samples": [{"labels": _labels({**KEY, "rank": "0"}), "value": 1}],
            }
        ],
    }


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_the_step_rate_panel_does_not_spike_when_a_restart_in_place_steps_back(
    tmp_path: Path,
) -> None:
    """The dashboard's step rate across a restart in place, evaluated by promtool: one step a
    second before and after. The same case run on rate() of the step gauge (what the panel
    used to query) fails: the gauge stepping back from 100,000 reads as a counter reset, a
    spike of hundreds of steps a second, so the case can tell the two apart."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))

    def promtool_test(expr: str) -> subprocess.CompletedProcess[str]:
        doc = {"rule_files": ["rules.yaml"], "tests": [_step_rate_case(expr)]}
        (tmp_path / "panel_test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return subprocess.run(
            ["promtool", "test", "rules", "panel_test.yaml"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    panel = _panel_expr("Step rate")
    assert "fsdp_train_steps_run_total" in panel
    done = promtool_test(panel)
    assert done.returncode == 0, f"{panel}:\n{done.stdout}\n{done.stderr}"
    gauge = panel.replace("fsdp_train_steps_run_total", "fsdp_train_step")
    spiked = promtool_test(gauge)
    assert spiked.returncode != 0, f"the gauge's rate should spike:\n{spiked.stdout}"
