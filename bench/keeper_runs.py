"""What the keeper benches share (warm_launch.py, fast_hang.py): the worker tests' harness for
running two pods' keepers on this machine, and the time of a log line."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "worker"))
import worker_harness as harness  # noqa: E402 (the worker tests' harness, by path)

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")

__all__ = ["REPO", "harness", "when"]


def when(line: str) -> float | None:
    """The local time a keeper's or a rank's log line was written (None: it has no stamp)."""
    m = STAMP.match(line)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
