"""A warm launcher: a restart in place starts its ranks from a process that has torch imported.

Measured on this project's 2-core machine, a restart in place spent most of its seconds before
any rank ran a line of training: torchrun imports torch (2.6 s) before it starts its ranks,
and every rank then imports torch, DCP and FSDP again (3.7 s each, side by side). The keeper
(gang.py, launchers.py) keeps one of these beside its ranks: ``python -m fsdp_worker.keeper.warm
<torchrun argv>`` imports what a rank imports, then waits on its stdin. At the next
generation the keeper writes one JSON line (the generation's environment, this pod's node
rank and the store's endpoint, which moves when a spare takes node rank 0's place), and this
process does what torchrun's local agent does for a static rendezvous: forks
one child per local rank, gives each the environment torchrun would (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_*; see torch's ``local_elastic_agent``), runs the
training module or script in it as ``__main__``, and watches them: the first to fail has the
others stopped (SIGTERM, then SIGKILL after a grace) and this process exits 1, torchrun's code.
A SIGTERM (the pod's) is passed to the ranks, which save, as under torchrun.

Differences a rank can see: rank 0 hosts the gang's TCPStore on the rendezvous port itself
(``TORCHELASTIC_USE_AGENT_STORE=False``, as in a launch without torchrun), and ``/proc/<pid>/
environ`` of a forked rank is the launcher's, not its own: a rank names itself in its process
name instead (``rank-<RANK>``, what ``ps`` and the local cluster's fault injector read).

Nothing here imports the entry module ahead of time (a script's top level may train); only
torch and this package's library modules, which do nothing when imported. Forking after
``import torch`` is safe on CPU and before CUDA is initialized, which nothing here does.
``FSDP_WARM_LAUNCH=0`` in the image's environment turns this off (the keeper runs torchrun).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import io
import json
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from fsdp_worker import contract

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "fsdp_worker.train.main",  # the built-in trainer's library: nothing runs at import
    "fsdp_worker.kit",  # the trainer kit a team's own trainer may use
)
STOP_GRACE_SECONDS = 5.0
"""After the first rank fails: SIGTERM to the others, SIGKILL after this long (torchrun's
local agent waits 30 s; a restart in place should not)."""
NOT_LAUNCHED = contract.WARM_NOT_LAUNCHED
"""Its exit code when it cannot run the argv the way torchrun would (nothing was started);
a launch's own code is 0 or 1, as torchrun's."""


class LaunchError(ValueError):
    """A torchrun argv this launcher cannot run the same way (the keeper runs torchrun)."""


def _say(message: str) -> None:
    # Not `logging`: a forked rank inherits this process's logging state, and a trainer's own
    # logging.basicConfig is a no-op where the root logger already has a handler.
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} fsdp_worker.keeper.warm {message}", file=sys.stderr, flush=True)


def plan(argv: Sequence[str], node: int | None = None) -> dict[str, Any]:
    """What torchrun's argv asks for, through torch's own parser: the nodes, the ranks per
    node, this node's rank, the store's address, the run id, and what to run."""
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(list(argv))
    if args.rdzv_backend != "static":
        raise LaunchError(f"--rdzv-backend={args.rdzv_backend}: only static is launched warm")
    if not str(args.nnodes).isdigit() or not str(args.nproc_per_node).isdigit():
        raise LaunchError(
            f"--nnodes={args.nnodes} --nproc-per-node={args.nproc_per_node}: "
            "only fixed numbers are launched warm"
        )
    if args.no_python or args.run_path:
        raise LaunchError("--no-python and --run-path are not launched warm")
    host, _, port = str(args.rdzv_endpoint).rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"--rdzv-endpoint={args.rdzv_endpoint}: want host:port")
    return {
        "nodes": int(args.nnodes),
        "nproc": int(args.nproc_per_node),
        "node": int(args.node_rank if node is None else node),
        "host": host.strip("[]"),
        "port": int(port),
        "run_id": str(args.rdzv_id),
        "module": bool(args.module),
        "entry": str(args.training_script),
        "args": [str(a) for a in args.training_script_args],
        "signals": str(getattr(args, "signals_to_handle", "") or ""),
    }


def rank_env(p: dict[str, Any], local_rank: int) -> dict[str, str]:
    """The environment torchrun's local agent gives a rank (static rendezvous, no restarts)."""
    world = p["nodes"] * p["nproc"]
    rank = p["node"] * p["nproc"] + local_rank
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(p["node"]),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(p["nproc"]),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(p["nodes"]),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": p["host"],
        "MASTER_PORT": str(p["port"]),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": p["run_id"],
        "TORCHELASTIC_USE_AGENT_STORE": "False",  # rank 0 hosts the store
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if p.get("signals"):  # torchrun puts it in its own environment, which its ranks inherit
        env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = p["signals"]
    if p["nproc"] > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"  # torchrun's default for several ranks per node
    return env


def _name_process(name: str) -> None:
    """prctl(PR_SET_NAME): /proc/<pid>/comm, what ps shows (15 bytes)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _run_rank(p: dict[str, Any], local_rank: int, extra: dict[str, str]) -> int:
    """In the forked child: become the rank and run the entry as `__main__`. Returns its exit
    code; the interpreter then exits as any Python program does (threads joined, atexit)."""
    os.setsid()  # as torchrun starts each rank: a signal to the launcher's group spares it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(write_through=True)  # torchrun runs ranks with -u
    env = {**extra, **rank_env(p, local_rank)}
    os.environ.update(env)
    faults = sys.modules.get("fsdp_worker.runtime.faults")
    if faults is not None:  # imported here, before this generation's FSDP_GENERATION was set
        faults.reload()
    _name_process(f"rank-{env['RANK']}")
    sys.argv = [p["entry"], *p["args"]]
    try:
        if p["module"]:
            runpy.run_module(p["entry"], run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(p["entry"])))
            runpy.run_path(p["entry"], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:  # the rank's own uncaught error, as Python prints it
        traceback.print_exc()
        return 1
    return 0


class Ranks:
    """This node's forked ranks, watched until they end (torchrun's local agent, static)."""

    def __init__(self, children: dict[int, int]) -> None:
        self.children = children  # pid -> local rank
        self.failed: tuple[int, int] | None = None  # (local rank, exit status)

    def _signal_all(self, sig: int) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)  # each rank leads its own session

    def terminate(self, signum: int, frame: object) -> None:
        self._signal_all(signal.SIGTERM)

    def wait(self) -> int:
        stop_at: float | None = None
        while self.children:
            if stop_at is not None and time.monotonic() >= stop_at:
                self._signal_all(signal.SIGKILL)
                stop_at = None
            pid, status = os.waitpid(-1, os.WNOHANG if stop_at is not None else 0)
            if pid == 0:
                time.sleep(0.05)
                continue
            local = self.children.pop(pid, None)
            if local is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if code != 0 and self.failed is None:
                self.failed = (local, code)
                _say(f"local rank {local} (pid {pid}) exited {code}: stopping the others")
                self._signal_all(signal.SIGTERM)
                stop_at = time.monotonic() + STOP_GRACE_SECONDS
        return 0 if self.failed is None else 1


def launch(p: dict[str, Any], extra: dict[str, str]) -> int:
    """Fork this node's ranks; returns in the parent with the node's exit code (0, or 1
    after a rank failed), and in each child with that rank's exit code."""
    children: dict[int, int] = {}
    for local_rank in range(p["nproc"]):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return _run_rank(p, local_rank, extra)
        children[pid] = local_rank
    ranks = Ranks(children)
    signal.signal(signal.SIGTERM, ranks.terminate)
    return ranks.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if tuple(args[:2]) == contract.TORCHRUN_MODULE:
        args = args[2:]
    try:
        p = plan(args)
    except (LaunchError, SystemExit, ImportError) as exc:
        _say(f"not launching warm: {exc!r}")
        return NOT_LAUNCHED
    started = time.monotonic()
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _say(f"ready in {time.monotonic() - started:.1f}s (pid {os.getpid()})")
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the keeper no longer needs this one
    doc = json.loads(line)
    p["node"] = int(doc.get("node", p["node"]))
    host, _, port = str(doc.get("endpoint") or "").rpartition(":")
    if host and port.isdigit():  # node rank 0's store moved (a spare took its place)
        p["host"], p["port"] = host.strip("[]"), int(port)
    extra = {str(k): str(v) for k, v in (doc.get("env") or {}).items()}
    _say(f"launching node {p['node']}'s {p['nproc']} rank(s) of {p['entry']}")
    return launch(p, extra)


if __name__ == "__main__":
    sys.exit(main())
