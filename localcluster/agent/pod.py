"""One pod bound to a process node, from admission to deletion, reported like a kubelet.

A runner owns the pod's network namespace, volumes and container processes. It starts the
containers, turns each exit into a terminated state (exit code, reason, termination message),
applies the restart policy, honours deletion (SIGTERM, SIGKILL after the grace period, then
delete with grace 0) and carries out the faults aimed at it. While its node is "lost" it
reports nothing and its processes stay stopped. Decisions about status shape live in
``status``; process handling in ``container`` and ``cgroups``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from typing import Any

from localcluster.agent import container, context, expand, kube, netns, status, volumes

JSON = dict[str, Any]
log = logging.getLogger(__name__)
SETUP_ERRORS = (expand.EnvError, volumes.VolumeError, netns.NetError, kube.KubeError, OSError)


class PodRunner:
    """Runs and reports one pod (identified by its uid)."""

    def __init__(self, ctx: context.Context, *, pod: JSON, node_index: int) -> None:
        self.ctx = ctx
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        self.node_index = node_index
        self.dir = (
            ctx.settings.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        )
        self.memory_dir = netns.SHM_ROOT / ctx.network.stem / self.uid
        self.lock = threading.RLock()
        self.net: netns.PodNet | None = None
        self.volumes: dict[str, Any] = {}
        specs = pod["spec"]["containers"]
        self.specs = {c["name"]: c for c in specs}
        self.states = {c["name"]: status.Container(c["name"], c.get("image", "")) for c in specs}
        self.running: dict[str, container.Launched] = {}
        self.forced: dict[str, tuple[int, status.Reason, str]] = {}
        self.start_time = context.now()
        self.lost = False
        self.frozen = False
        self.terminating = False
        self.finished = threading.Event()

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Set up network and volumes, start every container, report. Runs in its own thread."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self.net = self.ctx.network.add_pod(
                node_index=self.node_index,
                hostname=container.pod_hostname(self.pod),
                fqdn=container.pod_fqdn(self.pod),
                namespace=self.pod["metadata"]["namespace"],
            )
            self.volumes = volumes.prepare(
                self.pod, pod_dir=self.dir, pvc_root=self.ctx.settings.state_dir / "pvc",
                memory_root=self.memory_dir, configmaps=self.ctx.configmap, token=self.ctx.token,
            )  # fmt: skip
            if self.pod["spec"].get("initContainers"):
                raise expand.EnvError("initContainers are not supported on process nodes")
            self.report()
            with self.lock:
                for name in self.specs:
                    if not self.terminating:
                        self._launch(name)
                if self.terminating and not self.running:
                    self._teardown()
        except SETUP_ERRORS as exc:
            log.warning("pod %s: cannot start: %s", self.path, exc)
            with self.lock:
                for state in self.states.values():
                    state.reason, state.message = status.Reason.CONFIG_ERROR, str(exc)
        self.report()

    def _launch(self, name: str) -> None:
        assert self.net is not None
        state = self.states[name]
        launched = container.launch(
            self.ctx, pod=self.pod, container=self.specs[name], pod_dir=self.dir,
            net=self.net, pod_volumes=self.volumes,
        )  # fmt: skip
        self.running[name] = launched
        state.state, state.pid, state.started_at = status.State.RUNNING, launched.popen.pid, None
        state.started_at, state.exit_code, state.message = context.now(), None, ""
        if self.frozen:
            launched.procs.stop()
        threading.Thread(target=self._wait, args=(name, launched), daemon=True).start()

    def _wait(self, name: str, launched: container.Launched) -> None:
        code = status.exit_code(launched.popen.wait())
        launched.procs.kill()  # what a runtime does when PID 1 goes: the rest go too
        with self.lock:
            state = self.states[name]
            message = container.termination_message(
                self.specs[name], launched=launched, exit_code=code
            )
            reason = status.exit_reason(code, oom=False)
            if container.start_failed(message, code):
                reason = status.Reason.START_ERROR
            if name in self.forced:
                code, reason, forced_message = self.forced.pop(name)
                message = forced_message or message
            state.state, state.exit_code, state.reason = status.State.TERMINATED, code, reason
            state.finished_at, state.message = context.now(), message
            self.running.pop(name, None)
            launched.procs.remove()
            if self._restart_wanted(code):
                # As the kubelet shows it: never a terminal phase while a restart is due.
                state.last_terminated = state.terminated()
                state.state, state.reason = status.State.WAITING, status.Reason.BACK_OFF
                state.message = f"back-off restarting failed container {name}"
                threading.Thread(target=self._restart, args=(name,), daemon=True).start()
            elif not self.running:
                self._teardown()
        self.report()

    def _restart_wanted(self, code: int) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if self.terminating or policy == "Never":
            return False
        return policy == "Always" or code != 0

    def _restart(self, name: str) -> None:
        state = self.states[name]
        time.sleep(min(10.0, 2.0**state.restart_count))
        with self.lock:
            if self.terminating:
                if not self.running:
                    self._teardown()
                return
            state.restart_count += 1
            try:
                self._launch(name)
            except SETUP_ERRORS as exc:
                state.state, state.reason, state.message = (
                    status.State.WAITING, status.Reason.CONFIG_ERROR, str(exc))  # fmt: skip
        self.report()

    def _teardown(self) -> None:
        """Once nothing runs: drop the network namespace (the pod object stays). Idempotent:
        the address goes back to the pool exactly once."""
        if self.net is not None and not self.finished.is_set():
            self.ctx.network.remove_pod(self.net)
        self.finished.set()

    def terminate(self, grace_s: float) -> None:
        """Deletion: SIGTERM, SIGKILL after ``grace_s``, final status, delete with grace 0."""
        with self.lock:
            self.terminating = True
            self.thaw()
            for launched in self.running.values():
                launched.procs.terminate()
            if not self.running:
                self._teardown()
        if not self.finished.wait(timeout=max(grace_s, 0.0)):
            with self.lock:
                for launched in list(self.running.values()):
                    launched.procs.kill()
            self.finished.wait(timeout=10.0)
        self.report()
        try:
            self.ctx.kube.request("DELETE", self.path, body={
                "gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})  # fmt: skip
        except kube.KubeError as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s: final delete failed: %s", self.path, exc)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.memory_dir, ignore_errors=True)

    def kill_now(self) -> None:
        """The pod object is gone (force-deleted): stop everything, report nothing."""
        with self.lock:
            self.lost = True
            self.terminating = True
            for launched in list(self.running.values()):
                launched.procs.cont()
                launched.procs.kill()
            if not self.running:
                self._teardown()
        shutil.rmtree(self.memory_dir, ignore_errors=True)

    # --- faults --------------------------------------------------------------------------
    def _target(self, name: str | None) -> str:
        name = name or next(iter(self.specs))
        if name not in self.running:
            raise LookupError(f"container {name!r} of {self.path} is not running")
        return name

    def crash(self, name: str | None, *, exit_code: int, message: str = "") -> None:
        """Kill the container's processes; the status reports ``exit_code`` (reason Error)."""
        with self.lock:
            name = self._target(name)
            self.forced[name] = (exit_code, status.exit_reason(exit_code, oom=False), message)
            self.running[name].procs.kill()

    def oom(self, name: str | None) -> None:
        """What the kernel's OOM killer does to a container: SIGKILL, OOMKilled, 137."""
        with self.lock:
            name = self._target(name)
            code = status.SIGNAL_BASE + signal.SIGKILL
            self.forced[name] = (code, status.Reason.OOM_KILLED, "")
            self.running[name].procs.kill()

    def kill_rank(self, rank: int, *, sig: int) -> list[int]:
        """Signal the torchrun worker(s) whose environment says ``RANK=<rank>``."""
        wanted = f"RANK={rank}".encode()
        hit = []
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/environ", "rb") as environ:
                    if wanted in environ.read().split(b"\0"):
                        os.kill(pid, sig)
                        hit.append(pid)
            except (OSError, ProcessLookupError):
                continue
        if not hit:
            raise LookupError(f"no process with RANK={rank} in {self.path}")
        return hit

    def freeze(self) -> None:
        with self.lock:
            self.frozen = True
            for launched in self.running.values():
                launched.procs.stop()

    def thaw(self) -> None:
        with self.lock:
            self.frozen = False
            for launched in self.running.values():
                launched.procs.cont()

    def set_link(self, *, up: bool) -> None:
        if self.net is None:
            raise LookupError(f"{self.path} has no network namespace")
        self.ctx.network.set_link(self.net, up=up)

    def pids(self) -> list[int]:
        with self.lock:
            return [pid for launched in self.running.values() for pid in launched.procs.pids()]

    # --- status --------------------------------------------------------------------------
    def report(self) -> None:
        """Patch the pod's status with what the runner knows (not while its node is lost)."""
        with self.lock:
            if self.lost:
                return
            body = status.pod_status(
                old=self.pod.get("status", {}),
                containers=list(self.states.values()),
                init_done=True,
                host_ip=self.ctx.network.node_ip(self.node_index),
                pod_ip=self.net.ip if self.net else None,
                start_time=self.start_time,
                now=context.now(),
            )
            try:
                answer = self.ctx.kube.request(
                    "PATCH", self.path + "/status", body={"status": body},
                    content_type=kube.STRATEGIC,
                )  # fmt: skip
            except kube.KubeError as exc:
                if exc.status != 404:
                    log.warning("pod %s: status patch failed: %s", self.path, exc)
                return
            if answer.get("metadata", {}).get("uid") == self.uid:
                self.pod = answer
