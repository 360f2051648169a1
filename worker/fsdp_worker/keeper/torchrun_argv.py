"""torchrun's command line as a keeper rewrites it.

A spare's pod starts with the template of node rank 0's command; when it takes a node's place
its keeper sets `--node-rank`, and when node rank 0 moves (a spare promoted) every keeper points
`--rdzv-endpoint` at the new store. Apart from the keeper (gang.py) because these are pure
functions of a list of strings, used by the warm launchers (launchers.py) too; they must touch
only torchrun's own options, never a same-named argument of the trainer after them. A host:port
is parsed by contract/keeper.py's `host_port`.
"""

from __future__ import annotations

from collections.abc import Sequence


def with_node_rank(argv: Sequence[str], node: int) -> list[str]:
    """torchrun's argv with `--node-rank` set to `node` (a spare's template says 0)."""
    return _with_option(argv, ("--node-rank", "--node_rank"), str(node))


def with_endpoint(argv: Sequence[str], endpoint: str) -> list[str]:
    """torchrun's argv with `--rdzv-endpoint` (the static rendezvous' store) at `endpoint`."""
    return _with_option(argv, ("--rdzv-endpoint", "--rdzv_endpoint"), endpoint)


def rendezvous(argv: Sequence[str]) -> str:
    """torchrun's `--rdzv-endpoint` in `argv` ("" when it has none)."""
    names = ("--rdzv-endpoint", "--rdzv_endpoint")
    for i, arg in enumerate(argv):
        if arg.startswith(tuple(f"{n}=" for n in names)):
            return arg.split("=", 1)[1]
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
    return ""


def _with_option(argv: Sequence[str], names: tuple[str, ...], value: str) -> list[str]:
    """`argv` with torchrun's first option of `names` set to `value`: the launcher's own,
    not a same-named argument of the trainer after it."""
    out, done, skip = [], False, False
    for arg in argv:
        if skip:
            out.append(value)
            skip, done = False, True
        elif not done and arg.startswith(tuple(f"{n}=" for n in names)):
            out.append(f"{arg.split('=', 1)[0]}={value}")
            done = True
        else:
            skip = not done and arg in names
            out.append(arg)
    return out
