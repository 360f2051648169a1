"""Operator settings, read once from the environment at start-up.

Every knob has a docstring and a safe default; nothing here talks to the cluster.
"""

from __future__ import annotations

import dataclasses
import os

from fsdp_operator.policy import restarts


@dataclasses.dataclass(frozen=True)
class Settings:
    storage_template: str = ""
    """Where the operator sees a job's checkpoint volume: a path with {namespace} and {claim},
    e.g. /mnt/ckpt/{namespace}/{claim}. Empty: the operator cannot read checkpoints and lets
    workers pick (`auto`), so lineage is then the workers' job."""
    metrics_port: int = 8000
    """Port of the operator's own Prometheus endpoint (0 disables it)."""
    metrics_cert_file: str = ""
    """With metrics_key_file: serve the metrics endpoint over TLS with this certificate (PEM)."""
    metrics_key_file: str = ""
    """The certificate's private key (PEM)."""
    metrics_client_ca_file: str = ""
    """With TLS: accept only scrapers whose client certificate this CA signed (mutual TLS)."""
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    """kopf's liveness probe endpoint."""
    scrape_timeout_seconds: float = 1.0
    """Timeout of one scrape of rank 0's metrics (hang detection, status.step)."""
    scrape_max_interval_seconds: float = 60.0
    """A healthy job's rank 0 is scraped every min(progressDeadlineSeconds / 4, this)."""
    scrape_concurrency: int = 32
    """Scrapes in flight at once, across all jobs."""
    pass_workers: int = 16
    """Passes run at once (threads: a pass mostly waits on the API server)."""
    min_pause_seconds: float = 0.2
    """Least time between two passes of one job, however many events arrive."""
    error_backoff_initial_seconds: float = 1.0
    """After a failed pass the job's next pass waits this long, doubled for each failure in a
    row (watch events do not cut it short), and back to this after a pass succeeds."""
    error_backoff_max_seconds: float = 300.0
    """The most a failing job's loop waits between passes."""
    leader_election: bool = True
    """Act only while holding the Lease (several replicas: one leads, the others stand by)."""
    lease_name: str = "fsdp-operator"
    lease_namespace: str = ""
    """Where the Lease lives; empty: the operator pod's own namespace (else `default`)."""
    watch_server_timeout: int = 60
    """Server-side watch timeout: a silently dead watch stream is re-opened this often."""
    watch_client_timeout: int = 90
    """Client-side watch timeout, a little above the server's."""
    node_lease_missed_renewals: int = 2
    """A node whose Lease in `node_lease_namespace` missed this many renewals in a row (silent
    for this many renew periods and a quarter, by this process's clock, while other nodes
    renewed) is lost, before it turns NotReady (nodelease.py): 22.5 s on a kubelet's default
    40 s Lease. 0: only NotReady counts."""
    node_lease_namespace: str = "kube-node-lease"
    worker_module: str = "fsdp_worker"
    """Python module torchrun runs in every pod. `fsdp_worker.train.standin` is the torch-free
    stand-in for dry runs and the operator's own tests."""
    deep_verify: bool = False
    """Also compare sha256 of every checkpoint file (slow for big checkpoints)."""
    heap_report: str = ""
    """SIGUSR2 writes a heap report to this path plus `.<n>` (heap.py); empty: none."""
    heap_frames: int = 0
    """With heap_report: trace every allocation with this many frames (0: no tracing)."""
    tunables: restarts.Tunables = dataclasses.field(default_factory=restarts.Tunables)
    """Node exclusion and draining knobs for decide()."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)
        tun = restarts.Tunables(
            node_exclusion_seconds=float(e.get("FSDPOP_NODE_EXCLUSION_SECONDS", "300")),
            max_excluded_nodes=int(e.get("FSDPOP_MAX_EXCLUDED_NODES", "8")),
            drain_timeout_seconds=float(e.get("FSDPOP_DRAIN_TIMEOUT_SECONDS", "120")),
            failure_grace_seconds=int(e.get("FSDPOP_FAILURE_GRACE_SECONDS", "5")),
        )
        return cls(
            storage_template=e.get("FSDPOP_STORAGE_TEMPLATE", ""),
            metrics_port=int(e.get("FSDPOP_METRICS_PORT", "8000")),
            metrics_cert_file=e.get("FSDPOP_METRICS_CERT_FILE", ""),
            metrics_key_file=e.get("FSDPOP_METRICS_KEY_FILE", ""),
            metrics_client_ca_file=e.get("FSDPOP_METRICS_CLIENT_CA_FILE", ""),
            liveness_endpoint=e.get("FSDPOP_LIVENESS", "http://0.0.0.0:8080/healthz"),
            scrape_timeout_seconds=float(e.get("FSDPOP_SCRAPE_TIMEOUT_SECONDS", "1")),
            scrape_max_interval_seconds=float(e.get("FSDPOP_SCRAPE_MAX_INTERVAL_SECONDS", "60")),
            scrape_concurrency=int(e.get("FSDPOP_SCRAPE_CONCURRENCY", "32")),
            pass_workers=int(e.get("FSDPOP_PASS_WORKERS", "16")),
            min_pause_seconds=float(e.get("FSDPOP_MIN_PAUSE_SECONDS", "0.2")),
            error_backoff_initial_seconds=float(e.get("FSDPOP_ERROR_BACKOFF_SECONDS", "1")),
            error_backoff_max_seconds=float(e.get("FSDPOP_ERROR_BACKOFF_MAX_SECONDS", "300")),
            leader_election=e.get("FSDPOP_LEADER_ELECTION", "1") != "0",
            lease_name=e.get("FSDPOP_LEASE_NAME", "fsdp-operator"),
            lease_namespace=e.get("FSDPOP_LEASE_NAMESPACE", e.get("POD_NAMESPACE", "")),
            node_lease_missed_renewals=int(e.get("FSDPOP_NODE_LEASE_MISSED_RENEWALS", "2")),
            node_lease_namespace=e.get("FSDPOP_NODE_LEASE_NAMESPACE", "kube-node-lease"),
            deep_verify=e.get("FSDPOP_DEEP_VERIFY", "") == "1",
            worker_module=e.get("FSDPOP_WORKER_MODULE", "fsdp_worker"),
            heap_report=e.get("FSDPOP_HEAP_REPORT", ""),
            heap_frames=int(e.get("FSDPOP_HEAP_FRAMES", "0")),
            tunables=tun,
        )
