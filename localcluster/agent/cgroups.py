"""Every process of one container, found and signalled as a unit.

torchrun starts its workers in sessions of their own, so a process group does not hold a
container together; a cgroup (v2, no controllers needed) does, and offers ``cgroup.kill`` and
``cgroup.freeze``. Where no writable cgroup2 hierarchy exists the container's process group is
the fallback. This module does not decide when to signal; the pod runner does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _state(pid: int) -> str:
    """The one-letter state of a process from /proc ('' when gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def cgroup2_available(root: Path) -> bool:
    return (root / "cgroup.procs").exists() and os.access(root, os.W_OK)


class ProcessSet:
    """The processes of one container: its cgroup, or its leader's process group."""

    def __init__(self, cgroup: Path | None) -> None:
        self.cgroup = cgroup
        self.leader: int | None = None
        if cgroup is not None:
            cgroup.mkdir(parents=True, exist_ok=True)

    def pids(self) -> list[int]:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                return [int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()]
            return []
        if self.leader is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry.name)) == self.leader:
                        found.append(int(entry.name))
        return found

    def signal_all(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def terminate(self) -> None:
        """SIGTERM to the leader's process group, as a container runtime signals PID 1."""
        if self.leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.leader, signal.SIGTERM)

    def kill(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "cgroup.kill").write_text("1")
        self.signal_all(signal.SIGKILL)
        if self.leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.leader, signal.SIGKILL)

    def stop(self) -> None:
        """SIGSTOP everything; freezing first means no child is forked unseen meanwhile."""
        frozen = self._freeze(True)
        pids = self.pids()
        self.signal_all(signal.SIGSTOP)
        if frozen:
            self._freeze(False)
        # A frozen task takes its SIGSTOP only once thawed: wait, so the fault is synchronous.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_state(p) not in "TXZ" for p in pids):
            time.sleep(0.01)

    def cont(self) -> None:
        self.signal_all(signal.SIGCONT)

    def _freeze(self, on: bool) -> bool:
        if self.cgroup is None:
            return False
        try:
            (self.cgroup / "cgroup.freeze").write_text("1" if on else "0")
        except OSError:
            return False
        if on:
            deadline = time.monotonic() + 2.0
            while "frozen 1" not in (self.cgroup / "cgroup.events").read_text():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        return True

    def remove(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
