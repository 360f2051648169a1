"""``python -m localcluster up|down|status``: the local cluster for people.

``up`` starts the control plane and kubelet nodes (building and loading the images), prints the
``export KUBECONFIG=...`` line and returns while the processes keep running; ``down`` stops
what ``up`` recorded in the state directory; ``status`` shows components and nodes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from localcluster import controlplane, images


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__)
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".cluster"), help="default: ./.cluster"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the cluster and return")
    defaults = controlplane.NodeOptions()
    up.add_argument("--nodes", type=int, default=3, help="kubelet nodes (0: none)")
    up.add_argument("--gpus-per-node", type=int, default=defaults.gpus_per_node)
    up.add_argument(
        "--image",
        action="append",
        default=None,
        dest="images",
        help="image each node must hold (repeatable; default: the project's)",
    )
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for ready")
    sub.add_parser("down", help="stop the cluster")
    sub.add_parser("status", help="show components and nodes")
    return parser


def _up(args: argparse.Namespace) -> int:
    refs = tuple(args.images) if args.images is not None else images.TEST_IMAGES
    if args.images is None:
        images.build(images.TEST_TARGETS)
    nodes = controlplane.NodeOptions(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, images=refs
    )
    bin_dir = controlplane.find_bin_dir()
    started = time.monotonic()
    cluster = controlplane.Cluster.up(
        args.state_dir, nodes=nodes, bin_dir=bin_dir, timeout=args.timeout
    )
    print(
        f"cluster ready in {time.monotonic() - started:.1f}s at {cluster.server}", file=sys.stderr
    )
    print(f"logs: {cluster.logs}", file=sys.stderr)
    for line in cluster.started_lines():
        print(line, file=sys.stderr)
    print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        cluster = controlplane.Cluster.attach(args.state_dir)
    except controlplane.ControlPlaneError as err:
        print(err, file=sys.stderr)
        return 0
    started = time.monotonic()
    cluster.down()
    print(f"stopped in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = controlplane.Cluster.attach(args.state_dir)
    components = cluster.component_status()
    if not components:
        print(f"no cluster running in {cluster.state_dir}", file=sys.stderr)
        return 1
    for name, running in components.items():
        print(f"{name:20} {'running' if running else 'stopped'}")
    if not components.get("apiserver"):
        return 1
    print(f"server: {cluster.server}\nkubeconfig: {cluster.kubeconfig}\n")
    done = cluster.kubectl("get", "nodes", "-o", "wide", check=False)
    print(done.stdout or done.stderr, end="")
    return 0 if all(components.values()) else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"up": _up, "down": _down, "status": _status}
    try:
        return handlers[args.command](args)
    except controlplane.ControlPlaneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
