"""The simulated nodes of bench/gang_scale.py: the real keepers (fsdp_worker.keeper.gang.Keeper)
and coordinator over real sockets on 127.0.0.1, with a rank stand-in in place of torchrun.

Two processes per gang, as the measurement needs: node rank 0's keeper and the coordinator it
serves alone in one (`--node-zero`: its CPU and peak memory are the coordinator's figures, as a
pod's would be), every other node's keeper as a thread of the other (`--nodes N`), which injects
the failures, times the restarts and prints one JSON line. Imports the keeper from PYTHONPATH,
so that the orchestrator runs the same scenario against an earlier tree ("before").
"""

from __future__ import annotations

import json
import logging
import os
import resource
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, cast

from fsdp_worker.keeper import gang, launchers

STACK_BYTES = 256 * 1024
"""Thread stacks in the bench's processes: 2,000 keeper threads at the 8 MiB default reserve
16 GiB of address space for stacks that use a few KiB."""
RESTARTS = 1000  # in-place restarts allowed: the bench never runs out
SETTLED_SECONDS = 75.0
"""A restart not complete by then is reported as not restarted (past DOWN_TIMEOUT_SECONDS
the keepers have given up)."""


def make_gang(*, node: int, nodes: int, base_port: int) -> gang.Gang:
    """Every simulated node's FSDP_GANG, in one place: node i's keeper listens on base_port + i,
    node rank 0's being the coordinator. The fields the operator adds go here."""
    return gang.Gang(
        restarts=RESTARTS,
        coordinator=f"127.0.0.1:{base_port}",
        node=node,
        nodes=nodes,
        listen=base_port + node,
    )


class StandInRanks:
    """A generation's ranks as the keeper sees torchrun (subprocess.Popen's poll, wait, kill):
    they run until killed, or until the bench makes them fail."""

    pid = -1

    def __init__(self) -> None:
        self.returncode: int | None = None
        self._ended = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._ended.wait(timeout)
        return self.returncode

    def end(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._ended.set()

    def kill(self) -> None:
        self.end(-9)

    def send_signal(self, signum: int) -> None:
        self.end(-signum)


class StandInLaunchers(launchers.Launchers):
    """The keeper's launcher seam: starts a StandInRanks and notes when (node, generation)."""

    def __init__(self, started: dict[tuple[int, int], float]) -> None:
        super().__init__(["stand-in"], token="bench")  # not torchrun's argv: no warm launcher
        self.started = started
        self.current = StandInRanks()

    def start(
        self, argv: Any, *, generation: int, delta: dict[str, str], node: int
    ) -> subprocess.Popen[bytes]:
        self.current = StandInRanks()
        self.started[(node, generation)] = time.time()
        return cast("subprocess.Popen[bytes]", self.current)

    def kill(self, ranks: subprocess.Popen[bytes]) -> None:
        ranks.kill()


def _keeper(node: int, nodes: int, base_port: int, started: dict[tuple[int, int], float]) -> Any:
    keeper = gang.Keeper(
        make_gang(node=node, nodes=nodes, base_port=base_port),
        ["stand-in"],
        launch=StandInLaunchers(started),
    )
    threading.Thread(target=keeper.run_generations, daemon=True).start()
    return keeper


class _Counted:
    """Connections the coordinator accepted, counted at socketserver's per-connection seam."""

    connections = 0


def _count_connections() -> None:
    """Wrap the transport's per-connection seam: lineserver's event loop (after) or
    socketserver's thread per connection (an earlier tree, "before")."""
    try:
        from fsdp_worker.keeper import lineserver
    except ImportError:
        serve = socketserver.ThreadingMixIn.process_request

        def counted(self: Any, request: Any, client_address: Any) -> None:
            _Counted.connections += 1
            serve(self, request, client_address)

        socketserver.ThreadingMixIn.process_request = counted  # type: ignore[method-assign]
        return
    connection = lineserver.LineServer._connection

    async def counted_async(self: Any, reader: Any, writer: Any) -> None:
        _Counted.connections += 1
        await connection(self, reader, writer)

    lineserver.LineServer._connection = counted_async  # type: ignore[method-assign]


def _usage() -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "peak_mb": ru.ru_maxrss / 1024}


def node_zero(nodes: int, base_port: int) -> None:
    """Node rank 0's keeper and its coordinator; on each stdin line, one JSON line of figures."""
    _count_connections()
    started: dict[tuple[int, int], float] = {}
    _keeper(0, nodes, base_port, started)
    print(json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        doc: dict[str, Any] = {"connections": _Counted.connections, **_usage()}
        doc["started"] = {str(g): t for (_, g), t in started.items()}
        print(json.dumps(doc), flush=True)
    os._exit(0)


class Gang:
    """One gang of `nodes` simulated nodes: node 0 in a child process, the rest here."""

    def __init__(self, nodes: int, base_port: int) -> None:
        self.nodes = nodes
        self.zero = subprocess.Popen(
            [sys.executable, __file__, "--node-zero", str(nodes), str(base_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.zero.stdout is not None
        json.loads(self.zero.stdout.readline())
        self.started: dict[tuple[int, int], float] = {}
        self.keepers = [_keeper(n, nodes, base_port, self.started) for n in range(1, nodes)]
        self.peak_threads = threading.active_count()

    def stats(self) -> dict[str, Any]:
        assert self.zero.stdin is not None and self.zero.stdout is not None
        self.zero.stdin.write("\n")
        self.zero.stdin.flush()
        doc: dict[str, Any] = json.loads(self.zero.stdout.readline())
        return doc

    def all_started(self, generation: int, deadline: float) -> float | None:
        """When the last node started `generation` (node 0's time from its process)."""
        others = [(n, generation) for n in range(1, self.nodes)]
        while time.time() < deadline:
            self.peak_threads = max(self.peak_threads, threading.active_count())
            if all(k in self.started for k in others):
                zero = self.stats()["started"].get(str(generation))
                if zero is not None:
                    return max(float(zero), *(self.started[k] for k in others))
            time.sleep(0.02)
        return None

    def fail(self, node: int) -> float:
        """Node `node`'s ranks exit 1 now, as a crashed rank's torchrun would."""
        keeper = self.keepers[node - 1]
        now = time.time()
        keeper.launchers.current.end(1)
        return now

    def close(self) -> None:
        self.zero.kill()


def scenario(nodes: int, *, repeats: int, base_port: int, steady_s: float) -> dict[str, Any]:
    """Bring-up, a steady window, then `repeats` failures of the last node, one at a time."""
    began = time.time()
    g = Gang(nodes, base_port)
    try:
        if g.all_started(0, time.time() + SETTLED_SECONDS) is None:
            raise RuntimeError("generation 0 did not start on every node")
        time.sleep(1.0)  # every keeper has met the coordinator
        up_s = time.time() - began
        a = g.stats()
        time.sleep(steady_s)
        b = g.stats()
        row: dict[str, Any] = {
            "nodes": nodes,
            "bring_up_s": round(up_s, 2),
            "steady_msgs_per_s": round((b["connections"] - a["connections"]) / steady_s, 1),
            "steady_cpu_pct": round(100 * (b["cpu_s"] - a["cpu_s"]) / steady_s, 1),
        }
        row.update(_failures(g, repeats))
        end = g.stats()
        row["coordinator_cpu_s_total"] = round(end["cpu_s"], 2)
        row["coordinator_peak_mb"] = round(end["peak_mb"], 1)
        row["simulation_peak_mb"] = round(_usage()["peak_mb"], 1)
        row["simulation_threads"] = g.peak_threads
        return row
    finally:
        g.close()


def _failures(g: Gang, repeats: int) -> dict[str, Any]:
    restart: list[float] = []
    msgs: list[float] = []
    cpu: list[float] = []
    for generation in range(1, repeats + 1):
        before = g.stats()
        t0 = g.fail(g.nodes - 1)
        done = g.all_started(generation, t0 + SETTLED_SECONDS)
        after = g.stats()
        if done is None:
            reached = sum(1 for n in range(1, g.nodes) if (n, generation) in g.started)
            return {
                "restarted_s": restart,
                "not_restarted": f"{reached} of {g.nodes - 1} nodes but 0",
            }
        restart.append(round(done - t0, 3))
        msgs.append(after["connections"] - before["connections"])
        cpu.append(after["cpu_s"] - before["cpu_s"])
        time.sleep(1.0)  # settle: the next failure is of a running generation
    ordered = sorted(restart)
    return {
        "restarted_s": restart,
        "restarted_p50_s": round(statistics.median(ordered), 3),
        "restarted_max_s": ordered[-1],
        "msgs_per_failure": round(sum(msgs) / len(msgs)),
        "cpu_s_per_failure": round(sum(cpu) / len(cpu), 3),
    }


def main() -> None:
    threading.stack_size(STACK_BYTES)
    if sys.argv[1] == "--node-zero":
        node_zero(int(sys.argv[2]), int(sys.argv[3]))
        return
    logging.disable(logging.WARNING)  # a thousand keepers' "restarting in place", on one stderr
    nodes, repeats, base_port, steady_s = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    row = scenario(nodes, repeats=repeats, base_port=base_port, steady_s=steady_s)
    print(json.dumps(row), flush=True)
    os._exit(0)  # a thousand keeper threads need no goodbye


if __name__ == "__main__":
    main()
