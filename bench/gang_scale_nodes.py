"""The simulated nodes of bench/gang_scale.py: the real keepers (fsdp_worker.keeper.gang.Keeper)
and coordinator over real sockets on 127.0.0.1, with a rank stand-in in place of torchrun.

Node rank 0's keeper and the coordinator it serves run alone in one process (`--part N port 0
1`: its CPU, peak memory and connections are the coordinator's figures, as a pod's would be);
every other node's keeper is a thread of one of several processes of PER_PROCESS keepers each
(3,000 threads of 1,023 keepers on one GIL timed the harness, not the keepers). This process
injects the failures over their stdin, times the restarts and prints one JSON line. Imports the
keeper from PYTHONPATH, so that the orchestrator runs the same scenario against an earlier tree
("before").
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
PER_PROCESS = 64
"""Simulated keepers per process, node 0's aside (alone in its own). At 256 a thousand keepers'
threads queued on four GILs after every broadcast: the coordinator had answered every node in
0.3 s and the last keeper read its answer 1.6 s later (a timeline of one restart); at 64 that
tail is the harness's no more (1,024 nodes: 16 processes, ~45 MB each)."""
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


def part(nodes: int, base_port: int, first: int, last: int) -> None:
    """Nodes first..last-1's keepers in this process (node 0's alone: its coordinator's CPU,
    memory and connections are this process's); answers the orchestrator's stdin commands,
    one JSON line each: `stats`, `started G` (node -> when it started generation G), `fail N`
    (node N's ranks exit 1 now, as a crashed rank's torchrun would)."""
    if first == 0:
        _count_connections()
    started: dict[tuple[int, int], float] = {}
    keepers = {n: _keeper(n, nodes, base_port, started) for n in range(first, last)}
    print(json.dumps({"ready": True}), flush=True)
    peak = threading.active_count()
    for line in sys.stdin:
        what, _, arg = line.strip().partition(" ")
        peak = max(peak, threading.active_count())
        doc: dict[str, Any] = {}
        if what == "stats":
            doc = {"connections": _Counted.connections, "threads": peak, **_usage()}
        elif what == "started":
            doc = {str(n): t for (n, g), t in list(started.items()) if g == int(arg)}
        elif what == "fail":
            doc = {"t": time.time()}
            keepers[int(arg)].launchers.current.end(1)
        print(json.dumps(doc), flush=True)
    os._exit(0)


class Part:
    """One process of simulated nodes (`part`), driven over its stdin and stdout."""

    def __init__(self, nodes: int, base_port: int, first: int, last: int) -> None:
        self.first, self.last = first, last
        argv = [__file__, "--part", *(str(x) for x in (nodes, base_port, first, last))]
        self.proc = subprocess.Popen(
            [sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ready(self) -> None:
        assert self.proc.stdout is not None
        json.loads(self.proc.stdout.readline())

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        doc: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return doc


class Gang:
    """One gang of `nodes` simulated nodes: node 0 in a process of its own, the others in
    processes of at most PER_PROCESS keepers each (a thousand keeper threads on one GIL timed
    the harness, not the keepers)."""

    def __init__(self, nodes: int, base_port: int) -> None:
        self.nodes = nodes
        bounds = [(0, 1)] + [(i, min(i + PER_PROCESS, nodes)) for i in range(1, nodes, PER_PROCESS)]
        self.parts = [Part(nodes, base_port, lo, hi) for lo, hi in bounds if lo < hi]
        self.parts[0].ready()  # the coordinator listens before the others ask
        for p in self.parts[1:]:
            p.ready()

    def stats(self) -> dict[str, Any]:
        """Node 0's process: the coordinator's connections, CPU and memory."""
        return self.parts[0].ask("stats")

    def simulation(self) -> dict[str, Any]:
        """The other processes' peak memory (the largest) and threads (in all)."""
        rows = [p.ask("stats") for p in self.parts[1:]]
        return {
            "simulation_processes": len(rows),
            "simulation_peak_mb": round(max((r["peak_mb"] for r in rows), default=0.0), 1),
            "simulation_threads": sum(r["threads"] for r in rows),
        }

    def started(self, generation: int) -> dict[int, float]:
        out: dict[int, float] = {}
        for p in self.parts:
            out.update({int(n): t for n, t in p.ask(f"started {generation}").items()})
        return out

    def all_started(self, generation: int, deadline: float) -> float | None:
        """When the last node, node 0 included, started `generation`."""
        while time.time() < deadline:
            started = self.started(generation)
            if len(started) >= self.nodes:
                return max(started.values())
            time.sleep(0.05)
        return None

    def fail(self, node: int) -> float:
        part = next(p for p in self.parts if p.first <= node < p.last)
        return float(part.ask(f"fail {node}")["t"])

    def close(self) -> None:
        for p in self.parts:
            p.proc.kill()


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
        row.update(g.simulation())
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
            reached = len(g.started(generation))
            return {"restarted_s": restart, "not_restarted": f"{reached} of {g.nodes} nodes"}
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


PROFILE_ENV = "GANG_SCALE_PROFILE"
"""A path: node 0's process (the coordinator) runs under cProfile, its stats written there
after each `stats` command (where its CPU goes, apart from the simulated keepers'):
`GANG_SCALE_PROFILE=/tmp/c.prof python bench/gang_scale_nodes.py 1024 3 21000 2`."""


def _profile_coordinator() -> None:
    """Profile the coordinator's event loop (where it answers every request), written to
    PROFILE_ENV's path whenever the orchestrator asks for `stats`."""
    import cProfile

    from fsdp_worker.keeper import lineserver

    profile = cProfile.Profile()
    serve = lineserver.LineServer.serve_forever

    def profiled(self: Any, poll_interval: float = 0.5) -> None:
        profile.enable()
        serve(self, poll_interval)

    lineserver.LineServer.serve_forever = profiled  # type: ignore[method-assign]
    original = _usage

    def usage() -> dict[str, float]:
        profile.dump_stats(os.environ[PROFILE_ENV])
        return original()

    globals()["_usage"] = usage


def main() -> None:
    threading.stack_size(STACK_BYTES)
    if sys.argv[1] == "--part":
        logging.disable(logging.WARNING)
        args = [int(x) for x in sys.argv[2:6]]
        if args[2] == 0 and os.environ.get(PROFILE_ENV):
            _profile_coordinator()
        part(*args)
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
