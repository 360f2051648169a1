"""A rank's median step time, kept in its pod for the next generation of a restart in place.

The fast hang deadline (flight.fast_deadline) waits for FAST_AFTER_STEPS of a process's own
steps before it judges: the first steps after a start are slow and measure nothing. After a
restart in place that leaves a window, five steps long, in which a rank that stops is judged
only at the job's progress deadline (minutes where steps take seconds). The gang that restarts
is the same gang on the same pods, so its pace is known: each rank writes its median step here
while it trains, and the next generation's rank of the same local rank, at the same world size,
judges by it from its second step (the first, where it compiles and its peers connect, is never
judged) until its own steps suffice.

The file lives in the pod's own temporary directory, which a restart in place keeps and a new
pod does not have; it is named by the gang, the attempt, the local rank and the world size, so a
resize or another job's keeper on the same host never reads it. A file that cannot be read or
parsed is no prior: the rule waits for its own steps, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile

from fsdp_worker import contract

log = logging.getLogger(__name__)

WRITE_EVERY_SECONDS = 5.0
"""How often a training rank writes its median again (from the watchdog, never the step)."""


def path(local_rank: int) -> str | None:
    """This rank's file, or None where there is no gang (no restart in place to carry it to)."""
    gang = os.environ.get(contract.ENV_GANG)
    if not gang:
        return None
    key = "\0".join(
        (
            gang,
            os.environ.get(contract.ENV_ATTEMPT, ""),
            os.environ.get(contract.ENV_JOB_UID, ""),
            os.environ.get("WORLD_SIZE", ""),
            str(local_rank),
        )
    )
    name = "fsdp-pace-" + hashlib.sha256(key.encode()).hexdigest()[:20] + ".json"
    return os.path.join(os.environ.get("TMPDIR") or tempfile.gettempdir(), name)


def read(local_rank: int) -> float | None:
    """The median step seconds an earlier generation of this rank wrote, if any."""
    where = path(local_rank)
    if where is None:
        return None
    try:
        with open(where, encoding="utf-8") as f:
            median = json.load(f)["medianStepSeconds"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the previous generation's step time in %s: %s", where, exc)
        return None
    if not isinstance(median, int | float) or not math.isfinite(median) or median <= 0:
        log.warning("ignoring the previous generation's step time in %s: %r", where, median)
        return None
    return float(median)


def write(local_rank: int, median: float) -> None:
    """Replace this rank's file with `median` (atomically: a reader never sees half of it)."""
    where = path(local_rank)
    if where is None:
        return
    partial = f"{where}.{os.getpid()}.partial"
    try:
        with open(partial, "w", encoding="utf-8") as f:
            json.dump({"medianStepSeconds": median}, f)
        os.replace(partial, where)
    except OSError as exc:  # a full or read-only /tmp costs the next generation its prior only
        log.warning("could not keep the step time for the next generation in %s: %s", where, exc)
