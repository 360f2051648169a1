"""Start one container of a pod as a local process tree, and read what it left behind.

The process runs inside the pod's network namespace (``ip netns exec``), in a UTS namespace of
its own with the pod's hostname, with volumes bind-mounted at their mountPath by the launcher,
in a cgroup of its own and a new session. The image is ignored: the agent's Python
environment is first in PATH. This module starts and inspects; the pod runner decides.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from localcluster.agent import cgroups, context, expand, netns, volumes

JSON = dict[str, Any]
MESSAGE_LIMIT = 4096
FALLBACK_LOG_LINES = 80
LAUNCHER = Path(__file__).with_name("launch.py")
START_ERROR_PREFIX = "failed to start container:"
START_ERROR_CODE = 128
"""What the launcher exits with when it cannot exec (as containerd reports StartError)."""


@dataclasses.dataclass
class Launched:
    """A started container process and the files it writes."""

    popen: subprocess.Popen[bytes]
    procs: cgroups.ProcessSet
    termination: Path
    log: Path


def launch(
    ctx: context.Context,
    *,
    pod: JSON,
    container: JSON,
    pod_dir: Path,
    net: netns.PodNet,
    pod_volumes: dict[str, Path],
) -> Launched:
    """Start the container; raises expand.EnvError / volumes.VolumeError on a bad spec."""
    name = container["name"]
    hostname = pod_hostname(pod)
    env = expand.container_env(
        pod, container, base=ctx.base_env(hostname), configmaps=ctx.configmap
    )
    argv = expand.container_argv(container, env)
    termination = pod_dir / f"{name}.termination-log"
    termination.write_text("")
    mounts = volumes.container_mounts(container, volumes=pod_volumes, termination_file=termination)
    cgroup = None
    if ctx.cgroups is not None:
        cgroup = ctx.cgroups / pod["metadata"]["uid"] / name
    procs = cgroups.ProcessSet(cgroup)
    cgroup_fd = os.open(cgroup / "cgroup.procs", os.O_WRONLY) if cgroup else None
    spec = {
        "argv": argv,
        "env": env,
        "cwd": container.get("workingDir"),
        "hostname": hostname,
        "cgroupFd": cgroup_fd,
        "mounts": mounts,
        "errorFile": str(termination),
        "createdLog": str(netns.MOUNTPOINTS),
    }
    spec_file = pod_dir / f"{name}.launch.json"
    spec_file.write_text(json.dumps(spec))
    log = pod_dir / f"{name}.log"
    command = [
        shutil.which("ip") or "ip", "netns", "exec", net.netns,
        "unshare", "--uts", sys.executable, "-I", str(LAUNCHER), str(spec_file),
    ]  # fmt: skip
    popen = _spawn(command, log=log, env=env, cgroup_fd=cgroup_fd)
    procs.leader = popen.pid
    return Launched(popen=popen, procs=procs, termination=termination, log=log)


def _spawn(
    command: list[str], *, log: Path, env: dict[str, str], cgroup_fd: int | None
) -> subprocess.Popen[bytes]:
    """A new session (so SIGTERM to the group reaches the whole tree), output to the log."""
    try:
        with log.open("ab") as out:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, close_fds=True,
                pass_fds=() if cgroup_fd is None else (cgroup_fd,),
            )  # fmt: skip
    finally:
        if cgroup_fd is not None:
            os.close(cgroup_fd)


def pod_hostname(pod: JSON) -> str:
    return str(pod["spec"].get("hostname") or pod["metadata"]["name"])[:63]


def pod_fqdn(pod: JSON) -> str | None:
    """``hostname.subdomain.namespace.svc.cluster.local`` when the pod sets a subdomain."""
    subdomain = pod["spec"].get("subdomain")
    if not subdomain:
        return None
    namespace = pod["metadata"]["namespace"]
    return f"{pod_hostname(pod)}.{subdomain}.{namespace}.svc.{netns.CLUSTER_DOMAIN}"


def termination_message(container: JSON, *, launched: Launched, exit_code: int) -> str:
    """The termination file's first 4 KiB; the log's tail if the policy says so and it failed."""
    try:
        with launched.termination.open("rb") as handle:
            message = handle.read(MESSAGE_LIMIT).decode(errors="replace")
    except OSError:
        message = ""
    policy = container.get("terminationMessagePolicy", "File")
    if not message.strip() and exit_code != 0 and policy == "FallbackToLogsOnError":
        lines = launched.log.read_bytes()[-MESSAGE_LIMIT:].decode(errors="replace").splitlines()
        message = "\n".join(lines[-FALLBACK_LOG_LINES:])
    return message


def start_failed(message: str, exit_code: int) -> bool:
    return exit_code == START_ERROR_CODE and message.startswith(START_ERROR_PREFIX)
