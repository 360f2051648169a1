"""scheduler-plugins' kube-scheduler, with its Coscheduling plugin, as a second scheduler on the
local cluster: gang scheduling by PodGroup (scheduling.x-k8s.io/v1alpha1).

Built from its Go module by ``build-scheduler-plugins.sh``. It runs beside the cluster's own
scheduler under another name (``SCHEDULER_NAME``, the name scheduler-plugins' own
as-a-second-scheduler manifests give it), so only pods that name it are its: the rest of a
shared test cluster is placed as before. It reads PodGroups and pods with the admin kubeconfig
(the test cluster's; a real install gives it a role of its own). The Coscheduling plugin needs
no controller of its own to gate a gang: it counts a group's pods by their label itself.

    with SchedulerPlugins(cluster) as scheduler:
        ...  # pods with schedulerName SCHEDULER_NAME and a pod-group label are gang-placed
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from localcluster import controlplane, poll, procs

SCHEDULER_NAME = "scheduler-plugins-scheduler"
PODGROUP_CRD = "scheduling.x-k8s.io_podgroups.yaml"
PERMIT_WAIT_SECONDS = 10
"""How long the plugin holds a gang's first placed pods for the rest (a PodGroup's
scheduleTimeoutSeconds overrides it): short, so a test sees a gang that cannot fit let go."""


def find_dir() -> Path:
    """The build directory (bin/kube-scheduler, crds/), building it on first use;
    ``FSDPOP_SCHEDULER_PLUGINS_DIR`` overrides."""
    return controlplane.built_dir(
        "build-scheduler-plugins.sh", override="FSDPOP_SCHEDULER_PLUGINS_DIR"
    )


def config(*, kubeconfig: Path, permit_wait_seconds: int = PERMIT_WAIT_SECONDS) -> str:
    """The KubeSchedulerConfiguration: one profile, ``SCHEDULER_NAME``, with Coscheduling at
    every extension point and as the queue's sort (as the module's manifests/coscheduling
    config has it), no leader election."""
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                    "queueSort": {
                        "enabled": [{"name": "Coscheduling"}],
                        "disabled": [{"name": "*"}],
                    },
                },
                "pluginConfig": [
                    {
                        "name": "Coscheduling",
                        "args": {"permitWaitingTimeSeconds": permit_wait_seconds},
                    }
                ],
            }
        ],
    }
    return yaml.safe_dump(doc)


class SchedulerPlugins:
    """The second scheduler on one cluster; ``start``/``stop`` or use it as a context manager."""

    def __init__(self, cluster: controlplane.Cluster, *, plugins_dir: Path | None = None) -> None:
        self.cluster = cluster
        self._plugins_dir = plugins_dir
        self._dir = cluster.state_dir / "scheduler-plugins"
        self._procs: procs.Registry | None = None
        self.port = 0

    @property
    def log(self) -> Path:
        return self.cluster.logs / "scheduler-plugins.log"

    def __enter__(self) -> SchedulerPlugins:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, timeout: float = 120.0) -> None:
        """The PodGroup CRD, then the scheduler; returns once it answers its health check.
        Anything started is stopped again if a step fails."""
        built = self._plugins_dir or find_dir()
        deadline = time.monotonic() + timeout
        self._dir.mkdir(parents=True, exist_ok=True)
        crd = str(built / "crds" / PODGROUP_CRD)
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", crd)
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crd)
        (self._dir / "config.yaml").write_text(config(kubeconfig=self.cluster.kubeconfig))
        self.port = controlplane.free_port()
        self._procs = procs.Registry(self._dir / "scheduler-plugins.json")
        try:
            self._procs.spawn("scheduler-plugins", self._argv(built), log=self.log, cwd=self._dir)
            self._wait_healthy(deadline)
        except BaseException:
            self.stop()
            raise

    def _argv(self, built: Path) -> list[str]:
        kubeconfig = str(self.cluster.kubeconfig)
        return [
            str(built / "bin" / "kube-scheduler"),
            f"--config={self._dir / 'config.yaml'}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self._dir / 'certs'}",  # it signs its own serving certificate here
            "--profiling=false",
        ]

    def _wait_healthy(self, deadline: float) -> None:
        url = f"https://127.0.0.1:{self.port}/healthz"
        ca = self._dir / "certs" / "kube-scheduler.crt"

        def healthy() -> bool:
            if self._procs is not None and not self._procs.alive():
                raise controlplane.ControlPlaneError(
                    f"scheduler-plugins exited; {self.log}:\n{procs.tail(self.log)}"
                )
            return procs.https_ok(url, ca=ca)

        try:
            poll.until(
                "scheduler-plugins healthy",
                healthy,
                timeout=deadline - time.monotonic(),
                every=0.5,
            )
        except poll.TimedOut as exc:
            raise controlplane.ControlPlaneError(
                f"scheduler-plugins not healthy; {self.log}:\n{procs.tail(self.log)}"
            ) from exc

    def stop(self) -> None:
        """Stop the scheduler. The CRD stays: harmless without it, and other tests' PodGroups
        (deleted with their namespaces) need it to be deleted cleanly."""
        if self._procs is not None:
            self._procs.stop_all(grace=10.0)
            self._procs = None
