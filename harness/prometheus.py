"""A real Prometheus (Debian's `prometheus` package) scraping the cluster as the chart says.

Its scrape jobs are the chart's own monitors turned into plain Prometheus configuration: each
monitor's pod selector, port and relabelings (`podMetricsEndpoints`) as `relabel_configs`. Its
rule file is the chart's PrometheusRule. So a test that reads series or alerts from it checks
the chart's monitoring as a platform's prometheus-operator would run it, not a hand-written
copy.

Debian's build of Prometheus (2.42) leaves Kubernetes service discovery out
(`kubernetes_sd_configs` is not a field it knows), and building upstream's from its Go module
takes longer than the whole test suite. So `PodTargets` stands in for that one piece: it lists
the cluster's pods every second and writes them as `file_sd` target groups carrying the
labels Kubernetes SD (role `pod`) gives, one target per container port
(`__meta_kubernetes_namespace`, `..._pod_name`, `..._pod_phase`, `..._pod_label_<name>`,
`..._pod_labelpresent_<name>`, `..._pod_container_port_name`, ...). Everything after
discovery, the relabeling that picks targets and labels series, is Prometheus' own.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness import stack
from localcluster import poll

_CAMEL = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A prometheus-operator relabeling as Prometheus' own `relabel_configs` entry."""
    return {_CAMEL.get(key, key): value for key, value in rule.items()}


def _meta(name: str) -> str:
    """A Kubernetes label name as Kubernetes SD puts it in a meta label name."""
    return "".join(c if c.isalnum() else "_" for c in name)


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods as `file_sd` target groups with Kubernetes SD's role-`pod` meta labels."""
    groups = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            continue
        meta, status = pod["metadata"], pod["status"]
        common = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
        }
        for key, value in (meta.get("labels") or {}).items():
            common[f"__meta_kubernetes_pod_label_{_meta(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{_meta(key)}"] = "true"
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                labels = {
                    **common,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                }
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    return groups


class PodTargets:
    """Keeps a `file_sd` file of the cluster's pods current (Kubernetes SD's part, see above)."""

    def __init__(self, path: Path, list_pods: Callable[[], list[dict[str, Any]]]) -> None:
        self.path, self.list_pods = path, list_pods
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-targets", daemon=True)
        self.error = ""

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(pod_targets(self.list_pods())))
        os.replace(tmp, self.path)  # Prometheus never reads half a file

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.write()
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"

    def start(self) -> None:
        self.write()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _selected(selector: dict[str, Any]) -> list[dict[str, Any]]:
    """A monitor's pod selector (matchLabels, matchExpressions Exists) as keep rules."""
    keep = []
    for key, value in (selector.get("matchLabels") or {}).items():
        keep.append(
            {
                "source_labels": [f"__meta_kubernetes_pod_label_{_meta(key)}"],
                "regex": value,
                "action": "keep",
            }
        )
    for expr in selector.get("matchExpressions") or []:
        if expr["operator"] != "Exists":
            raise ValueError(f"matchExpressions operator {expr['operator']}: only Exists here")
        keep.append(
            {
                "source_labels": [f"__meta_kubernetes_pod_labelpresent_{_meta(expr['key'])}"],
                "regex": "true",
                "action": "keep",
            }
        )
    return keep


def scrape_job(monitor: dict[str, Any], targets: Path, interval: str) -> dict[str, Any]:
    """A PodMonitor as one Prometheus scrape job over the pods in `targets` (`PodTargets`)."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    namespaces = []
    names = spec.get("namespaceSelector", {}).get("matchNames")
    if not spec.get("namespaceSelector", {}).get("any"):
        # prometheus-operator's default: the monitor's own namespace
        names = names or [monitor["metadata"]["namespace"]]
        namespaces.append(
            {
                "source_labels": ["__meta_kubernetes_namespace"],
                "regex": "|".join(names),
                "action": "keep",
            }
        )
    port = {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": endpoint["port"],
        "action": "keep",
    }
    running = {
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "Running",
        "action": "keep",
    }
    return {
        "job_name": monitor["metadata"]["name"],
        "scrape_interval": interval,
        "scheme": endpoint.get("scheme", "http"),
        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
        "relabel_configs": [
            *namespaces,
            port,
            running,
            *_selected(spec["selector"]),
            *(_relabel(r) for r in endpoint.get("relabelings", [])),
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "instance"},
        ],
    }


class Prometheus:
    """`prometheus` on loopback with the chart's monitors and rules, fast intervals."""

    def __init__(
        self,
        workdir: Path,
        *,
        monitors: list[dict[str, Any]],
        rules: dict[str, Any],
        list_pods: Callable[[], list[dict[str, Any]]],
        interval: str = "2s",
    ) -> None:
        self.workdir = workdir
        self.port = stack.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.pods = PodTargets(workdir / "pods.json", list_pods)
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [scrape_job(m, self.pods.path, interval) for m in monitors],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.pods.start()
        log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115
        argv = [
            "prometheus",
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        poll.until("prometheus ready", self._ready, timeout=60, diagnosis=self.log_tail)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:  # noqa: S310 (loopback)
                return bool(answer.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: its series (labels and value), or an error naming the query."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (loopback)
            body = json.loads(answer.read())
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r}: {body}")
        return list(body["data"]["result"])

    def targets(self) -> str:
        """The scrape targets and their health: what to print when a series does not come."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as answer:  # noqa: S310 (loopback)
            active = json.loads(answer.read())["data"]["activeTargets"]
        found = "\n".join(
            f"{t['labels'].get('job')} {t['scrapeUrl']} {t['health']} {t.get('lastError', '')}"
            for t in active
        )
        return found + (f"\npod listing failed: {self.pods.error}" if self.pods.error else "")

    def log_tail(self, lines: int = 40) -> str:
        path = self.workdir / "prometheus.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        self.pods.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
