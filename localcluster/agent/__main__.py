"""Command line of the process-node agent (and a ``fault`` passthrough to localcluster.faults).

Parses arguments, starts the agent, waits for SIGTERM/SIGINT, then shuts it down cleanly.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from localcluster import faults
from localcluster.agent import context


def _parse(argv: list[str]) -> context.Settings:
    parser = argparse.ArgumentParser(prog="python -m localcluster.agent", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cpu", default="16")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--name-prefix", default="node-")
    parser.add_argument("--zones", type=int, default=2)
    parser.add_argument("--heartbeat-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    return context.Settings(
        kubeconfig=args.kubeconfig.resolve(),
        state_dir=args.state_dir.resolve(),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpu=args.cpu,
        memory=args.memory,
        name_prefix=args.name_prefix,
        zones=args.zones,
        heartbeat_s=args.heartbeat_seconds,
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["fault"]:
        return faults.main(argv[1:])
    settings = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Imported late: the fault passthrough must not need root or the network helpers.
    from localcluster.agent import control, runtime

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    agent = runtime.Agent(settings)
    server = None
    try:
        agent.start()
        server = control.ControlServer(agent)
        logging.info("agent up: nodes %s, pod subnet %s", agent.nodes.names,
                     agent.ctx.network.subnet)  # fmt: skip
        stop.wait()
    finally:
        if server is not None:
            server.stop()
        agent.shutdown()
        logging.info("agent down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
