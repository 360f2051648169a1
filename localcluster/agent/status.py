"""Pure kubelet-style pod status: what a pod's containers are doing, rendered as ``status``.

Given container states the runner observed, this computes the phase, the conditions (keeping
each unchanged condition's lastTransitionTime) and containerStatuses exactly as a kubelet
reports them. No I/O and no clock reads: times come in as strings.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

JSON = dict[str, Any]
SIGNAL_BASE = 128


class Phase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class State(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    TERMINATED = "terminated"


class Reason(enum.StrEnum):
    CREATING = "ContainerCreating"
    COMPLETED = "Completed"
    ERROR = "Error"
    OOM_KILLED = "OOMKilled"
    START_ERROR = "StartError"
    CONFIG_ERROR = "CreateContainerConfigError"
    BACK_OFF = "CrashLoopBackOff"


@dataclasses.dataclass
class Container:
    """What the runner knows of one container."""

    name: str
    image: str
    state: State = State.WAITING
    reason: str = Reason.CREATING
    pid: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    message: str = ""
    restart_count: int = 0
    last_terminated: JSON | None = None

    def terminated(self) -> JSON:
        out: JSON = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id(),
        }
        if self.message:
            out["message"] = self.message
        return out

    def container_id(self) -> str:
        return f"process://{self.pid or 0}"


def exit_code(returncode: int) -> int:
    """A Popen return code as a container exit code: killed by signal N reads 128 + N."""
    return SIGNAL_BASE - returncode if returncode < 0 else returncode


def exit_reason(code: int, *, oom: bool) -> Reason:
    if oom:
        return Reason.OOM_KILLED
    return Reason.COMPLETED if code == 0 else Reason.ERROR


def phase(containers: list[Container]) -> Phase:
    if containers and all(c.state is State.TERMINATED for c in containers):
        return Phase.SUCCEEDED if all(c.exit_code == 0 for c in containers) else Phase.FAILED
    if any(c.state is State.RUNNING or c.last_terminated for c in containers):
        return Phase.RUNNING
    return Phase.PENDING


def container_status(c: Container) -> JSON:
    state: JSON
    if c.state is State.RUNNING:
        state = {"running": {"startedAt": c.started_at}}
    elif c.state is State.TERMINATED:
        state = {"terminated": c.terminated()}
    else:
        state = {"waiting": {"reason": c.reason, **({"message": c.message} if c.message else {})}}
    out: JSON = {
        "name": c.name,
        "image": c.image,
        "imageID": "",
        "containerID": c.container_id() if c.state is not State.WAITING else None,
        "ready": c.state is State.RUNNING,
        "started": c.state is State.RUNNING,
        "restartCount": c.restart_count,
        "state": state,
        "lastState": {"terminated": c.last_terminated} if c.last_terminated else {},
    }
    return out


def _condition(old: list[JSON], kind: str, *, ok: bool, reason: str | None, now: str) -> JSON:
    status = "True" if ok else "False"
    previous = next((c for c in old if c.get("type") == kind), None)
    since = previous["lastTransitionTime"] if previous and previous["status"] == status else now
    out: JSON = {"type": kind, "status": status, "lastTransitionTime": since,
                 "lastProbeTime": None}  # fmt: skip
    if reason and not ok:
        out["reason"] = reason
    return out


def pod_status(
    *,
    old: JSON,
    containers: list[Container],
    init_done: bool,
    host_ip: str,
    pod_ip: str | None,
    start_time: str,
    now: str,
) -> JSON:
    """The whole ``status`` for a strategic-merge patch (PodScheduled and others stay as set)."""
    current = phase(containers)
    conds = old.get("conditions") or []
    ready = current is Phase.RUNNING and all(c.state is State.RUNNING for c in containers)
    not_ready = (
        "PodCompleted" if current in (Phase.SUCCEEDED, Phase.FAILED) else "ContainersNotReady"
    )
    out: JSON = {
        "phase": str(current),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "conditions": [
            _condition(
                conds, "PodReadyToStartContainers", ok=pod_ip is not None, reason=None, now=now
            ),  # fmt: skip
            _condition(
                conds, "Initialized", ok=init_done, reason="ContainersNotInitialized", now=now
            ),
            _condition(conds, "ContainersReady", ok=ready, reason=not_ready, now=now),
            _condition(conds, "Ready", ok=ready, reason=not_ready, now=now),
        ],
        "containerStatuses": [container_status(c) for c in containers],
    }
    if pod_ip:
        out["podIP"] = pod_ip
        out["podIPs"] = [{"ip": pod_ip}]
    return out
