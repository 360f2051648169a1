"""How a keeper starts a generation's ranks: torchrun (the pod's command), or the warm launcher
(warm.py) it keeps ready beside the running ranks.

Every node runs the same launcher in a generation: torchrun in generation 0, the warm launcher
in every later one and at a spare's start, a new one where none is ready (cold: its imports
happen now, still one fewer than torchrun's). The two cannot meet in one gang: torchrun's agents
wait for node 0's agent, and a warm node 0 has none. Where the warm launcher cannot run the argv
the way torchrun would, or keeps dying, every later generation runs torchrun.

Apart from the keeper (gang.py) because it owns the launcher processes and what is known of
them (started when, died how often, refused or not); the keeper says only when a generation
starts and when the next one's launcher may be started. No torch: the warm launcher imports it
in its own process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Sequence

from fsdp_worker import contract
from fsdp_worker.keeper import processes, storeport, torchrun_argv

log = logging.getLogger(__name__)

WARM_AFTER_SECONDS = 10.0
"""A generation's own start (imports, rendezvous, load) has the CPU first; then the keeper
starts the warm launcher its next restart will use (warm.py). ``FSDP_WARM_LAUNCH`` in the
image's environment sets these seconds; 0 turns the warm launcher off."""
WARM_MODULE = "fsdp_worker.keeper.warm"


class Launchers:
    """The running generation's launcher and the next generation's warm one, for a keeper
    whose launches carry `token` (processes.KEEPER_TOKEN)."""

    def __init__(self, argv: Sequence[str], *, token: str) -> None:
        self.token = token
        self.warm: subprocess.Popen[bytes] | None = None  # the next generation's launcher
        self.spawned_at = 0.0
        self.launched_warm = False  # this generation's ranks came from the warm launcher
        self.deaths = 0
        self.after = _seconds(os.environ.get(contract.ENV_WARM_LAUNCH), WARM_AFTER_SECONDS)
        self.enabled = self.after > 0 and tuple(argv[1:3]) == contract.TORCHRUN_MODULE

    def start(
        self, argv: Sequence[str], *, generation: int, delta: dict[str, str], node: int
    ) -> subprocess.Popen[bytes]:
        """This generation's ranks, `delta` added to their environment: generation 0 from
        torchrun (the pod's command), every later one from the warm launcher (its ranks skip
        torchrun's and their own imports) unless warm launches are off, as on every node.
        Node rank 0 first waits for the last generation's store to let its port go
        (storeport.py says why)."""
        if node == 0:
            port = storeport.port_of(torchrun_argv.rendezvous(argv))
            if port is not None:
                storeport.wait_until_free(port)
        self.spawned_at = time.monotonic()
        self.launched_warm = False
        launcher = self._go_warm(argv, delta=delta, node=node) if generation > 0 else None
        if launcher is not None:
            log.info(
                "generation %d starts from the warm launcher (pid %d)", generation, launcher.pid
            )
            self.launched_warm = True
            return launcher
        env = {**os.environ, **delta, processes.KEEPER_TOKEN: self.token}
        return subprocess.Popen(list(argv), env=env)

    def refused(self, outcome: str, code: int) -> bool:
        """The warm launcher could not run this argv the same way (its log says why): nor can
        any other node's (the same argv), so every node runs torchrun from now on."""
        if self.launched_warm and code == contract.WARM_NOT_LAUNCHED and outcome == "exited":
            log.warning("the warm launcher refused the launch: restarts run torchrun")
            self.enabled = False
            return True
        return False

    def _go_warm(
        self, argv: Sequence[str], *, delta: dict[str, str], node: int
    ) -> subprocess.Popen[bytes] | None:
        """The warm launcher, told to start this generation's ranks (a new one where the one
        kept died since); None: warm launches are off (the same on every node)."""
        for _ in range(2):
            self.keep(argv, now=True)
            launcher, self.warm = self.warm, None
            if launcher is None or launcher.stdin is None:
                return None
            try:
                go = {"env": delta, "node": node, "endpoint": torchrun_argv.rendezvous(argv)}
                launcher.stdin.write(json.dumps(go).encode() + b"\n")
                launcher.stdin.close()
                return launcher
            except OSError as exc:  # it died since (a kill, memory): a new one
                log.warning("the warm launcher is gone (%s): starting another", exc)
                self.drop(launcher)
        return None

    def keep(self, argv: Sequence[str], *, now: bool = False) -> None:
        """Start the next generation's warm launcher once this one has had its start."""
        if not self.enabled:
            return
        if self.warm is not None:
            if self.warm.poll() is None:
                return
            if self.warm.returncode == contract.WARM_NOT_LAUNCHED:  # it cannot run this argv
                log.warning("the warm launcher refused the launch: restarts run torchrun")
                self.warm, self.enabled = None, False
                return
            self.warm = None  # it died unused (a kill, memory): a new one below, twice
            self.deaths += 1
            if self.deaths > 2:
                log.warning("the warm launcher keeps dying: restarts run torchrun")
                self.enabled = False
                return
        if not now and time.monotonic() - self.spawned_at < self.after:
            return
        command = [argv[0], "-m", WARM_MODULE, *argv[3:]]
        try:
            self.warm = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                env={**os.environ, processes.KEEPER_TOKEN: self.token},
            )
        except OSError as exc:
            log.warning("no warm launcher (%s): restarts run torchrun", exc)
            self.enabled = False

    def drop(self, launcher: subprocess.Popen[bytes] | None = None) -> None:
        """End a warm launcher that will not be used (closing its stdin ends it)."""
        launcher = launcher or self.warm
        if launcher is self.warm:
            self.warm = None
        if launcher is None or launcher.poll() is not None:
            return
        with contextlib.suppress(OSError, ValueError):
            if launcher.stdin is not None:
                launcher.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            launcher.kill()

    def kill(self, ranks: subprocess.Popen[bytes]) -> None:
        """SIGKILL a generation's launcher `ranks` and everything this keeper's token marks
        (gang.Keeper._kill says why), but the next generation's warm launcher."""
        processes.kill_launched(self.token, roots=[ranks.pid], spare=self.spared())

    def spared(self) -> set[int]:
        """The next generation's warm launcher and what it started: not killed with the
        running generation's ranks."""
        if self.warm is None:
            return set()
        return {self.warm.pid, *processes.descendants(self.warm.pid)}


def _seconds(raw: str | None, default: float) -> float:
    try:
        return max(0.0, float(raw)) if raw else default
    except ValueError:
        log.warning("%s=%r is not a number of seconds: %s", contract.ENV_WARM_LAUNCH, raw, default)
        return default
