"""The keeper's kill reaches every process it launched, even one whose parent died first."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fsdp_worker.keeper import processes

# A "torchrun" that starts a "rank" in a session of its own and dies at once: the rank is
# orphaned (reparented to init), as when torchrun is OOM-killed before its ranks.
LAUNCHER = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                        start_new_session=True)
print(rank.pid, flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_an_orphaned_rank_is_killed_by_the_keepers_token() -> None:
    token = "t0ken" + os.urandom(4).hex()
    env = {**os.environ, processes.KEEPER_TOKEN: token}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, stdout=subprocess.PIPE)
    assert launcher.stdout is not None
    rank = int(launcher.stdout.readline())
    launcher.wait(timeout=30)
    assert _alive(rank) and rank not in processes.descendants(launcher.pid), "orphaned"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    spared = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    try:
        # /proc's order is by pid, which can wrap. Popen returns once the child's exec began,
        # before the kernel has laid out its new environment: on a loaded machine (seen in CI)
        # /proc/<pid>/environ is still empty for a moment, so the wait is for it to show.
        wanted, deadline = sorted([rank, spared.pid]), time.monotonic() + 10
        while (found := sorted(processes.launched_by(token))) != wanted:
            assert time.monotonic() < deadline, (found, rank, spared.pid)
            time.sleep(0.05)
        killed = processes.kill_launched(token, roots=[launcher.pid], spare={spared.pid})
        assert rank in killed and other.pid not in killed and spared.pid not in killed
        deadline = time.monotonic() + 10
        while _alive(rank):  # reaped by init, or a zombie of it: either way not running
            assert time.monotonic() < deadline, "the orphaned rank still runs"
            time.sleep(0.05)
        assert other.poll() is None and spared.poll() is None, "nothing else was touched"
    finally:
        for proc in (other, spared):
            proc.kill()
            proc.wait()
