"""heap.py: a traced operator process writes a report per SIGUSR2, and the second one names the
line that allocated between the two."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fsdp_operator.io import heap

pytestmark = pytest.mark.timeout(120)

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from fsdp_operator.io import heap
    assert heap.install(sys.argv[1], frames=5)
    os.kill(os.getpid(), signal.SIGUSR2)
    kept = [bytearray(4096) for _ in range(2000)]  # about 8 MiB, held to the second report
    os.kill(os.getpid(), signal.SIGUSR2)
    print(len(kept))
    """
)


def reports(tmp_path: Path, child: str, frames: int) -> tuple[str, str]:
    base = tmp_path / "heap"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONTRACEMALLOC"}
    done = subprocess.run(
        [sys.executable, "-c", child, str(base), str(frames)],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    first, second = Path(f"{base}.1").read_text(), Path(f"{base}.2").read_text()
    assert "compared_with nothing" in first
    assert "compared_with report 1" in second
    return first, second


def section(report: str, title: str) -> list[str]:
    return report.split(f"== {title}")[1].split("\n\n")[0].splitlines()[1:]


def test_traced_report_names_the_line_that_grew(tmp_path: Path) -> None:
    _, second = reports(tmp_path, CHILD, frames=5)
    kib, blocks, where = section(second, "growth by lineno")[0].split()
    assert where == "<string>:6"  # the bytearray line of CHILD
    assert int(kib) >= 7800 and int(blocks) >= 2000


SHAPES = textwrap.dedent(
    """
    import os, signal, sys
    from fsdp_operator.io import heap
    assert heap.install(sys.argv[1], frames=int(sys.argv[2]))
    os.kill(os.getpid(), signal.SIGUSR2)
    kept = [{"podname": f"pod-{i}", "podphase": "Running"} for i in range(20000)]
    os.kill(os.getpid(), signal.SIGUSR2)
    print(len(kept))
    """
)


def test_untraced_report_names_the_dicts_and_types_that_grew(tmp_path: Path) -> None:
    _, second = reports(tmp_path, SHAPES, frames=0)
    kib, count, *_rest, shape = section(second, "dicts by keys")[0].split(maxsplit=4)
    assert shape == "{podname, podphase}" and int(count) == 20000
    types = {line.split()[-1]: int(line.split()[1]) for line in section(second, "objects by")}
    assert types["dict"] >= 20000 and types["str"] >= 19000  # each pod name is a new string
    memory = {line[:26].strip(): line[26:].split() for line in section(second, "memory")}
    assert int(memory["pymalloc in live blocks"][1]) > 20000 * 200 / 1024  # dict+str >= 200 B
    assert "growth by lineno" not in second  # nothing traced


def test_no_path_traces_nothing() -> None:
    code = "import tracemalloc; from fsdp_operator.io import heap; "
    code += "print(heap.install(''), tracemalloc.is_tracing())"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONTRACEMALLOC"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["False", "False"], done.stderr


@pytest.mark.parametrize(
    ("filename", "want"),
    [
        ("/v/lib/python3.11/site-packages/kopf/_core/engines/indexing.py", "kopf"),
        ("/v/lib/python3.11/site-packages/six.py", "six"),
        ("/work/operator/fsdp_operator/io/cache.py", "fsdp_operator"),
        ("/usr/lib/python3.11/asyncio/tasks.py", "stdlib:asyncio"),
        ("/usr/lib/python3.11/json/decoder.py", "stdlib:json"),
        ("<string>", "<string>"),
    ],
)
def test_files_are_grouped_by_package(filename: str, want: str) -> None:
    assert heap.package(filename) == want


TRIM = textwrap.dedent(
    """
    from fsdp_operator.io import heap

    def rss():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])

    keep, junk = [], []
    for i in range(50_000):  # 200 MB, one block in a hundred kept: the heap cannot shrink
        junk.append(bytes(4000) + bytes([i % 256]))
        if i % 100 == 0:
            keep.append(bytes(4000) + bytes([1]))
    junk.clear()
    before = rss()
    print(heap.trim(), before - rss())
    """
)


def test_trim_returns_memory_freed_inside_the_heap() -> None:
    done = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, timeout=60)
    trimmed, freed_kib = done.stdout.split()
    assert trimmed == "True", done.stderr
    assert int(freed_kib) > 100_000  # of the ~196 MB freed but kept before the trim
