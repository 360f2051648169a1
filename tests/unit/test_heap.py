"""heap.py: a traced operator process writes a report per SIGUSR2, and the second one names the
line that allocated between the two."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fsdp_operator import heap

pytestmark = pytest.mark.timeout(120)

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from fsdp_operator import heap
    assert heap.install(sys.argv[1])
    os.kill(os.getpid(), signal.SIGUSR2)
    kept = [bytearray(4096) for _ in range(2000)]  # about 8 MiB, held to the second report
    os.kill(os.getpid(), signal.SIGUSR2)
    print(len(kept))
    """
)


def test_second_report_names_what_grew(tmp_path: Path) -> None:
    base = tmp_path / "heap"
    env = dict(os.environ, PYTHONTRACEMALLOC="5")
    done = subprocess.run([sys.executable, "-c", CHILD, str(base)], env=env,
                          capture_output=True, text=True, timeout=100)  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = Path(f"{base}.1").read_text()
    second = Path(f"{base}.2").read_text()
    assert "compared_with nothing" in first
    assert "compared_with report 1" in second
    by_line = second.split("== growth by lineno (KiB, blocks) ==")[1].splitlines()[1]
    kib, blocks, where = by_line.split()
    assert where == "<string>:6", by_line  # the bytearray line of CHILD
    assert int(kib) >= 7800 and int(blocks) >= 2000


def test_not_tracing_installs_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONTRACEMALLOC"}
    code = f"from fsdp_operator import heap; print(heap.install({str(tmp_path / 'h')!r}))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout.strip() == "False"
    assert "PYTHONTRACEMALLOC is not" in done.stderr


@pytest.mark.parametrize(
    ("filename", "want"),
    [
        ("/v/lib/python3.11/site-packages/kopf/_core/engines/indexing.py", "kopf"),
        ("/v/lib/python3.11/site-packages/six.py", "six"),
        ("/work/operator/fsdp_operator/cache.py", "fsdp_operator"),
        ("/usr/lib/python3.11/asyncio/tasks.py", "stdlib:asyncio"),
        ("/usr/lib/python3.11/json/decoder.py", "stdlib:json"),
        ("<string>", "<string>"),
    ],
)
def test_files_are_grouped_by_package(filename: str, want: str) -> None:
    assert heap.package(filename) == want
