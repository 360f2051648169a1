"""bench/gang_scale.py at its smallest (8 simulated nodes, one failure), so that it cannot rot:
the real keepers and coordinator over real sockets restart every node after a node's ranks
fail, and the bench reads the figures the lead's `make bench-gang-scale` plots. Seconds."""

from __future__ import annotations

import sys

from worker_harness import REPO

sys.path.insert(0, str(REPO / "bench"))
import gang_scale  # the bench, by path


def test_eight_nodes_restart_after_one_fails() -> None:
    # A steady window longer than a held request (coordinator.HOLD_SECONDS, 2 s): keepers
    # long-poll, so a 1 s window could see no connection at all (seen under load).
    row = gang_scale.run_size(8, worker=REPO / "worker", repeats=1, steady_s=5.0)
    assert "not_restarted" not in row, row
    assert 0 < row["restarted_max_s"] < 10, row
    assert row["msgs_per_failure"] > 0 and row["steady_msgs_per_s"] > 0, row
