"""Container launcher: runs inside the pod's network, mount and UTS namespaces, then execs.

Started by the agent as ``ip netns exec <ns> unshare --uts python -I launch.py <spec.json>``:
``ip netns exec`` has already given this process a private mount namespace, so the bind mounts
made here (volumes at their mountPath, the termination-message file) are seen by the container
alone. It joins the container's cgroup first so that every later child is tracked, and ends in
``execvpe``, so the container's main process keeps this pid. Standard library only, run by path:
it must import nothing from the project.
"""

import ctypes
import json
import os
import socket
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
START_ERROR = 128


def _mount(source: str, target: str, *, read_only: bool, created: list[str]) -> None:
    if not os.path.lexists(target):
        missing, parent = [], os.path.dirname(target)
        while parent and not os.path.lexists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        created.extend([*missing, target])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, MS_BIND, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"bind mount {source} -> {target}: {os.strerror(errno)}")
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        if libc.mount(b"none", target.encode(), None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"read-only remount of {target}: {os.strerror(errno)}")


def _prepare(spec: dict) -> None:  # type: ignore[type-arg]
    if spec.get("cgroupFd") is not None:
        # An fd the agent opened: /sys inside the network namespace is a fresh sysfs without
        # the cgroup mounts.
        os.write(spec["cgroupFd"], str(os.getpid()).encode())
        os.close(spec["cgroupFd"])
    socket.sethostname(spec["hostname"])
    created: list[str] = []
    try:
        for mount in spec["mounts"]:
            _mount(mount["source"], mount["target"], read_only=mount["readOnly"], created=created)
    finally:
        if created and spec.get("createdLog"):
            with open(spec["createdLog"], "a") as log:
                log.write("".join(path + "\n" for path in created))
    if spec.get("cwd"):
        os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec["cwd"])


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    try:
        _prepare(spec)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])  # noqa: S606
    except OSError as exc:
        with open(spec["errorFile"], "w") as out:
            out.write(f"failed to start container: {exc}")
        sys.stderr.write(f"failed to start container: {exc}\n")
        os._exit(START_ERROR)


if __name__ == "__main__":
    main()
