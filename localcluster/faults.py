"""Fault injection on the local cluster: a Python API and a command line.

Talks to the running process-node agent through the endpoint it advertises in
``<agent state dir>/agent.json`` (the control plane starts the agent with
``<cluster state dir>/agent``). Every verb acts the way the real failure would look to
Kubernetes and to the operator:

- ``crash``: the container's processes are killed; its status reads exitCode N, reason Error.
- ``oom``: SIGKILL; reason OOMKilled, exitCode 137.
- ``kill-rank``: signal (default SIGKILL) the worker with ``RANK=<n>``; torchrun notices.
- ``freeze`` / ``thaw``: SIGSTOP / SIGCONT every process of the pod (a hang; state T).
- ``lose-node`` / ``restore-node``: the node's lease and status stop, its pods freeze and go
  unreported (a partition); restore resumes them, or kills those deleted meanwhile.
- ``cut-link`` / ``restore-link``: the pod's veth goes down / up.
- ``evict``: the Eviction API (policy/v1), so PodDisruptionBudgets apply.

Standard library only; this module holds no agent logic.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ENDPOINT_FILE = "agent.json"


class FaultError(RuntimeError):
    """The agent refused or could not carry out a fault."""


class Faults:
    """Client for one agent, found through its state directory."""

    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir)

    @classmethod
    def for_cluster(cls, cluster_state_dir: Path | str) -> Faults:
        """The agent of a cluster started by ``localcluster.controlplane``."""
        return cls(Path(cluster_state_dir) / "agent")

    def call(self, verb: str, **args: Any) -> Any:
        endpoint = self.state_dir / ENDPOINT_FILE
        try:
            port = json.loads(endpoint.read_text())["port"]
        except (OSError, ValueError, KeyError) as exc:
            raise FaultError(f"no running agent advertised at {endpoint}: {exc}") from exc
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/{verb}",
            data=json.dumps(args).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
                return json.loads(answer.read())["result"]
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("error", str(exc))
            raise FaultError(f"{verb}: {detail}") from exc

    def crash(
        self, namespace: str, pod: str, *, exit_code: int = 1, container: str | None = None,
        message: str = "",
    ) -> None:  # fmt: skip
        """Kill the container; it is reported terminated with ``exit_code`` and ``message``."""
        self.call("crash", namespace=namespace, pod=pod, container=container,
                  exit_code=exit_code, message=message)  # fmt: skip

    def oom(self, namespace: str, pod: str, *, container: str | None = None) -> None:
        self.call("oom", namespace=namespace, pod=pod, container=container)

    def kill_rank(self, namespace: str, pod: str, *, rank: int, signal: int = 9) -> list[int]:
        """Signal one torchrun worker (env RANK=<rank>); torchrun reacts as to a real crash."""
        return list(self.call("kill-rank", namespace=namespace, pod=pod, rank=rank, signal=signal))

    def freeze(self, namespace: str, pod: str) -> None:
        self.call("freeze", namespace=namespace, pod=pod)

    def thaw(self, namespace: str, pod: str) -> None:
        self.call("thaw", namespace=namespace, pod=pod)

    def lose_node(self, node: str) -> None:
        self.call("lose-node", node=node)

    def restore_node(self, node: str) -> None:
        self.call("restore-node", node=node)

    def cut_link(self, namespace: str, pod: str) -> None:
        self.call("cut-link", namespace=namespace, pod=pod)

    def restore_link(self, namespace: str, pod: str) -> None:
        self.call("restore-link", namespace=namespace, pod=pod)

    def evict(self, namespace: str, pod: str) -> None:
        self.call("evict", namespace=namespace, pod=pod)

    def pids(self, namespace: str, pod: str) -> list[int]:
        """Every live process of the pod (for checks; not a fault)."""
        return list(self.call("pids", namespace=namespace, pod=pod))

    def netns(self, namespace: str, pod: str) -> str | None:
        """The pod's network namespace name, for ``ip netns exec`` (not a fault)."""
        found = self.call("netns", namespace=namespace, pod=pod)
        return None if found is None else str(found)


def _pod_ref(text: str) -> tuple[str, str]:
    namespace, _, name = text.rpartition("/")
    return namespace or "default", name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="the agent's state dir")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in ("crash", "oom", "freeze", "thaw", "cut-link", "restore-link", "evict", "pids"):
        sub = verbs.add_parser(verb)
        sub.add_argument("pod", help="[namespace/]name")
        if verb in ("crash", "oom"):
            sub.add_argument("--container")
        if verb == "crash":
            sub.add_argument("--exit-code", type=int, default=1)
            sub.add_argument("--message", default="")
    rank = verbs.add_parser("kill-rank")
    rank.add_argument("pod", help="[namespace/]name")
    rank.add_argument("rank", type=int)
    rank.add_argument("--signal", type=int, default=9)
    for verb in ("lose-node", "restore-node"):
        verbs.add_parser(verb).add_argument("node")
    verbs.add_parser("status")
    args = vars(parser.parse_args(argv))
    client = Faults(args.pop("state_dir"))
    verb = args.pop("verb")
    if "pod" in args:
        args["namespace"], args["pod"] = _pod_ref(args["pod"])
    try:
        result = client.call(verb, **{k: v for k, v in args.items() if v is not None})
    except FaultError as exc:
        print(exc, file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
