"""`python -m fsdp_operator`: run the operator (kopf, cluster-wide; replicas elect a leader on a
Lease, leader.py, so kopf's own peering stays off: `standalone`).

Subcommands: `run` (default) starts the operator; `crd` prints the CRD. The CLI for people is
`fsdpctl` (cli.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import sys

import kopf


def _two_malloc_arenas() -> None:
    """glibc gives threads that allocate their own arenas (up to 8 per core) and keeps what was
    freed in each: with passes and writers on 30-odd threads, RSS would follow the peak of a
    bring-up rather than what the operator holds. Two arenas, as MALLOC_ARENA_MAX=2 does."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fsdp_operator")
    parser.add_argument("command", nargs="?", default="run", choices=["run", "crd"])
    parser.add_argument("--liveness", default=None, help="kopf liveness endpoint URL")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "crd":
        from fsdp_operator.render import crd

        crd.main()
        return 0
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf logs every handler run at INFO; our own Events and logs say what matters.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    from fsdp_operator.io import heap
    from fsdp_operator.run import (
        handlers,  # noqa: F401  (registers the handlers)
        settings,
    )

    conf = settings.Settings.from_env()
    _two_malloc_arenas()  # before any thread starts
    heap.install(conf.heap_report, conf.heap_frames)
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=True,
            liveness_endpoint=args.liveness or conf.liveness_endpoint or None,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
