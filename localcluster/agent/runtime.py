"""The agent process: nodes, pod runners, cluster DNS and the fault endpoint, wired together.

Watches every pod and EndpointSlice; pods bound to this agent's nodes get a runner, slices feed
the DNS records. Fault requests arrive from the control endpoint and are applied here, where
the node and pod state meet (losing a node freezes its pods and silences them; restoring it
reconciles them with what the API server says now). Shutdown undoes everything it made.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from localcluster.agent import cgroups, context, dns, kube, kubeletapi, netns, nodes, pod

JSON = dict[str, Any]
log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed")
DEFAULT_GRACE_S = 30


class Agent:
    """Everything one ``python -m localcluster.agent`` process runs."""

    def __init__(self, settings: context.Settings) -> None:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        network = netns.Network(nodes=settings.nodes)
        cgroup = None
        if cgroups.cgroup2_available(netns.CGROUP_ROOT):
            cgroup = netns.CGROUP_ROOT / network.stem
        self.ctx = context.Context(
            settings=settings, kube=kube.Kube(settings.kubeconfig), network=network, cgroups=cgroup
        )
        self.nodes = nodes.Nodes(self.ctx)
        self.records = dns.Records()
        self.dns = dns.Server(network.gateway, self.records)
        self.runners: dict[str, pod.PodRunner] = {}
        self.lock = threading.RLock()
        self.stop = threading.Event()

    # --- main loop -----------------------------------------------------------------------
    def start(self) -> None:
        self.nodes.register()
        self.dns.start()
        self.kubelet_api = kubeletapi.KubeletApi(
            addresses=[self.ctx.network.node_ip(i) for i in range(len(self.nodes.names))],
            state_dir=self.ctx.settings.state_dir,
            is_running=self._container_running,
        )
        self._thread(self.nodes.run, self.stop)
        self._thread(self._watch, "/api/v1/pods", handle=self.on_pod, relisted=self._relisted_pods)
        slices = "/apis/discovery.k8s.io/v1/endpointslices"
        self._thread(self._watch, slices, handle=self._on_slice, relisted=None)

    def _thread(self, target: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        threading.Thread(
            target=target, args=args, kwargs=kwargs, daemon=True, name=target.__name__
        ).start()

    def _on_slice(self, kind: str, item: JSON) -> None:
        self.records.update(kind, item)

    def _watch(
        self,
        path: str,
        *,
        handle: Callable[[str, JSON], None],
        relisted: Callable[[list[JSON]], None] | None,
    ) -> None:
        """List, then watch from that version; relist whenever the watch breaks."""
        while not self.stop.is_set():
            try:
                listing = self.ctx.kube.get(path)
                items = listing.get("items", [])
                for item in items:
                    handle("ADDED", item)
                if relisted:
                    relisted(items)
                version = listing["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    for event in self.ctx.kube.watch(path, resource_version=version):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise kube.KubeError(obj.get("code", 500), obj.get("message", ""))
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            handle(event["type"], obj)
            except Exception as exc:  # a broken watch must never end the agent
                if not self.stop.is_set():
                    log.info("watch %s restarts: %s", path, exc)
                    time.sleep(1.0)

    def _relisted_pods(self, items: list[JSON]) -> None:
        present = {item["metadata"]["uid"] for item in items}
        with self.lock:
            gone = [r for uid, r in self.runners.items() if uid not in present and not r.lost]
        for runner in gone:
            self.on_pod("DELETED", runner.pod)

    # --- pods ----------------------------------------------------------------------------
    def on_pod(self, kind: str, item: JSON) -> None:
        node = item.get("spec", {}).get("nodeName")
        if node not in self.nodes.names:
            return
        uid = item["metadata"]["uid"]
        with self.lock:
            runner = self.runners.get(uid)
            if kind == "DELETED":
                if runner is not None and not runner.lost:
                    self.runners.pop(uid)
                    runner.kill_now()
                return
            if node in self.nodes.lost:
                return  # partitioned: this kubelet does not see the API server
            if runner is None:
                self._admit(item, node)
            elif item["metadata"].get("deletionTimestamp") and not runner.terminating:
                runner.terminating = True
                self._thread(self._terminate, runner, _grace(item))

    def _admit(self, item: JSON, node: str) -> None:
        meta = item["metadata"]
        if meta.get("deletionTimestamp"):
            self._thread(self._delete_now, item)
            return
        if item.get("status", {}).get("phase") in TERMINAL:
            return
        runner = pod.PodRunner(self.ctx, pod=item, node_index=self.nodes.index(node))
        self.runners[meta["uid"]] = runner
        self._thread(runner.start)

    def _terminate(self, runner: pod.PodRunner, grace_s: float) -> None:
        runner.terminate(grace_s)
        with self.lock:
            self.runners.pop(runner.uid, None)

    def _delete_now(self, item: JSON) -> None:
        meta = item["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        with contextlib.suppress(kube.KubeError):
            self.ctx.kube.request("DELETE", path, body={
                "gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})  # fmt: skip

    def runner(self, namespace: str, name: str) -> pod.PodRunner:
        with self.lock:
            for runner in self.runners.values():
                meta = runner.pod["metadata"]
                if (meta["namespace"], meta["name"]) == (namespace, name):
                    return runner
        raise LookupError(f"pod {namespace}/{name} is not running on this agent's nodes")

    def _container_running(self, target: tuple[str, str, str]) -> bool:
        namespace, name, container = target
        try:
            return container in self.runner(namespace, name).running
        except LookupError:
            return False

    def on_node(self, name: str) -> list[pod.PodRunner]:
        with self.lock:
            return [r for r in self.runners.values() if r.pod["spec"].get("nodeName") == name]

    # --- node loss -----------------------------------------------------------------------
    def lose_node(self, name: str) -> None:
        """Heartbeats stop; the node's pods freeze and go silent, as behind a partition."""
        with self.lock:
            self.nodes.lose(name)
            for runner in self.on_node(name):
                runner.lost = True
                runner.freeze()

    def restore_node(self, name: str) -> None:
        """Heartbeats resume; each frozen pod resumes, terminates or dies, as the API says."""
        self.nodes.restore(name)
        for runner in self.on_node(name):
            current = self.ctx.kube.get_or_none(runner.path)
            with self.lock:
                runner.lost = False
                if current is None or current["metadata"]["uid"] != runner.uid:
                    self.runners.pop(runner.uid, None)
                    runner.kill_now()
                    continue
                runner.pod = current
                if current["metadata"].get("deletionTimestamp"):
                    runner.terminating = True
                    self._thread(self._terminate, runner, _grace(current))
                    continue
                runner.thaw()
            runner.report()
        for item in self.ctx.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={name}")[
            "items"
        ]:
            self.on_pod("ADDED", item)

    # --- shutdown ------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every pod process and remove every namespace, link, file and cgroup made."""
        self.stop.set()
        with self.lock:
            runners = list(self.runners.values())
        for runner in runners:
            runner.kill_now()
        self.dns.stop()
        if hasattr(self, "kubelet_api"):
            self.kubelet_api.stop()
        self.ctx.network.destroy()


def _grace(item: JSON) -> float:
    seconds = item["metadata"].get("deletionGracePeriodSeconds")
    if seconds is None:
        seconds = item["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    return float(seconds)
