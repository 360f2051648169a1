"""Long-running local processes recorded in a JSON file, so another process can stop them.

Each process is started without a shell, in its own session (a terminal's hang-up does not reach
it), with its output in a log file. The record holds the exact argv, and a recorded PID is only
signalled while ``/proc/<pid>/cmdline`` still matches it, so a PID the kernel has reused for
someone else's process is never touched.

This module knows nothing about Kubernetes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Registry:
    """The processes recorded in one state file, plus free-form ``meta`` stored beside them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        data = self._load()
        self.meta: dict[str, Any] = data.get("meta", {})
        self._records: list[dict[str, Any]] = data.get("processes", [])

    def _load(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"meta": self.meta, "processes": self._records}, indent=2))
        tmp.replace(self.path)

    def spawn(
        self, name: str, argv: list[str], *, log: Path, cwd: Path, env: dict[str, str] | None = None
    ) -> int:
        """Start ``argv`` in the background and record it under ``name``; returns the PID.
        ``env`` is added to this process's environment (secrets stay off the argv)."""
        with log.open("ab") as out:
            child = subprocess.Popen(
                argv,
                env={**os.environ, **env} if env else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
            )
        self._children[child.pid] = child
        _await_exec(child.pid, argv)
        self._records.append({"name": name, "pid": child.pid, "argv": argv})
        self._save()
        return child.pid

    def _running(self, record: dict[str, Any]) -> bool:
        pid = int(record["pid"])
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return _cmdline(pid) == list(record["argv"])

    def status(self) -> dict[str, bool]:
        """Each recorded name and whether its process still runs."""
        return {r["name"]: self._running(r) for r in self._records}

    def pid(self, name: str) -> int | None:
        """The PID of the running process recorded as ``name``, or None."""
        for record in self._records:
            if record["name"] == name and self._running(record):
                return int(record["pid"])
        return None

    def alive(self) -> bool:
        return any(self.status().values())

    def stop_all(self, *, grace: float, graces: dict[str, float] | None = None) -> None:
        """Stop the recorded processes newest first, then forget them.

        Each gets SIGTERM and, if still running after its grace (``graces[name]`` or ``grace``),
        SIGKILL for its whole process group (it was started as that group's leader).
        """
        for record in reversed(self._records):
            self._stop(record, (graces or {}).get(record["name"], grace))
        self._records = []
        if self.path.parent.exists():
            self._save()

    def stop_named(self, wanted: Callable[[str], bool], *, grace: float) -> None:
        """Stop (newest first) and forget the recorded processes whose name ``wanted`` accepts."""
        for record in reversed([r for r in self._records if wanted(r["name"])]):
            self._stop(record, grace)
        self._records = [r for r in self._records if not wanted(r["name"])]
        if self.path.parent.exists():
            self._save()

    def _stop(self, record: dict[str, Any], grace: float) -> None:
        pid = int(record["pid"])
        if not self._running(record):
            self._reap(pid)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._running(record) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._running(record):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._reap(pid)

    def _reap(self, pid: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)


def _cmdline(pid: int) -> list[str] | None:
    """The argv of a live (non-zombie) process, or None."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # A zombie has an empty cmdline: it has exited, only its parent has not reaped it.
    return raw.decode(errors="replace").split("\0")[:-1] or None


def _await_exec(pid: int, argv: list[str], timeout: float = 2.0) -> None:
    # Popen can return while the child still shows the parent's name; another process reading
    # the record right then would not recognise it.
    deadline = time.monotonic() + timeout
    while _cmdline(pid) != argv and time.monotonic() < deadline:
        time.sleep(0.01)


def https_ok(
    url: str, *, ca: Path, client: tuple[Path, Path] | None = None, timeout: float = 2.0
) -> bool:
    """Whether a GET of ``url``, verified against ``ca`` and with the ``client`` certificate and
    key if given, answers 200. A ``ca`` not written yet (a self-signing server still starting)
    is a no."""
    if not url.startswith("https://"):
        raise ValueError(f"https_ok wants an https:// URL, got {url!r}")
    if not ca.exists():
        return False
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    try:
        # The scheme is checked above: no file:// or custom handlers.
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:  # noqa: S310
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def http_ok(url: str, *, timeout: float = 2.0) -> bool:
    """Whether a plain GET of a loopback ``url`` answers 200 (a readiness endpoint)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"http_ok wants an http://127.0.0.1: URL, got {url!r}")
    try:
        # The scheme and host are checked above.
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
