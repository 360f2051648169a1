"""Where the operator's memory goes, for the person sizing it.

Start the operator with ``PYTHONTRACEMALLOC=<frames>`` (Python traces every allocation from
interpreter start) and ``FSDPOP_HEAP_REPORT=<file>``; each SIGUSR2 then writes a report to
``<file>.<n>``: RSS, the traced total and its peak, live objects by type, and what grew since
the previous report (the first compares with nothing), by package, by source line and by call
stack. Signal once idle and once with the jobs running, and the second report is the cost of
the jobs. Tracing costs CPU and memory of its own; the RSS of a traced run is not the figure to
quote. Without ``PYTHONTRACEMALLOC`` nothing is installed.
"""

from __future__ import annotations

import collections
import gc
import logging
import signal
import time
import tracemalloc
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

_TOP = 40


def install(path: str) -> bool:
    """SIGUSR2 writes a heap report next to `path`; False (and a warning) when not tracing."""
    if not path:
        return False
    if not tracemalloc.is_tracing():
        log.warning("FSDPOP_HEAP_REPORT=%s is set but PYTHONTRACEMALLOC is not: no heap reports",
                    path)  # fmt: skip
        return False
    reporter = _Reporter(Path(path))
    signal.signal(signal.SIGUSR2, reporter.on_signal)
    log.info("heap reports on SIGUSR2 to %s.<n>", path)
    return True


def package(filename: str) -> str:
    """The package a source file belongs to: the directory under site-packages, our own package,
    or the standard library module."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            at = parts.index(marker)
            return parts[at + 1].removesuffix(".py") if at + 1 < len(parts) else filename
    if "fsdp_operator" in parts:
        return "fsdp_operator"
    lib = next((i for i, p in enumerate(parts) if p.startswith("python3")), None)
    if lib is not None and lib + 1 < len(parts):
        return "stdlib:" + parts[lib + 1].removesuffix(".py")
    return filename


class _Reporter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.last: tracemalloc.Snapshot | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        try:
            self.write()
        except Exception:  # a report is a diagnostic: never take the operator down
            log.exception("heap report failed")

    def write(self) -> None:
        started = time.monotonic()
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        current, peak = tracemalloc.get_traced_memory()
        self.count += 1
        out = Path(f"{self.path}.{self.count}")
        lines = [
            f"heap report {self.count} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
            f"rss_kib {_rss_kib()}",
            f"traced_kib {current // 1024} peak_kib {peak // 1024}",
            f"compared_with {'report ' + str(self.count - 1) if self.last else 'nothing'}",
            "",
            "== live objects by type (count) ==",
            *(f"{n:>10} {name}" for name, n in _types().most_common(_TOP)),
        ]
        lines += self._growth(snap, "filename", by_package=True)
        lines += self._growth(snap, "lineno")
        lines += self._growth(snap, "traceback", top=15)
        lines.append(f"\n(written in {time.monotonic() - started:.1f} s)")
        out.write_text("\n".join(lines) + "\n")
        self.last = snap
        log.info("heap report written to %s", out)

    def _growth(self, snap: tracemalloc.Snapshot, key: str, *, by_package: bool = False,
                top: int = _TOP) -> list[str]:  # fmt: skip
        rows: list[tuple[int, int, tracemalloc.Traceback]] = (
            [(d.size_diff, d.count_diff, d.traceback) for d in snap.compare_to(self.last, key)]
            if self.last
            else [(s.size, s.count, s.traceback) for s in snap.statistics(key)]
        )
        lines = [f"\n== growth by {'package' if by_package else key} (KiB, blocks) =="]
        if by_package:
            sizes: collections.Counter[str] = collections.Counter()
            blocks: collections.Counter[str] = collections.Counter()
            for size, count, trace in rows:
                sizes[package(trace[0].filename)] += size
                blocks[package(trace[0].filename)] += count
            return lines + [f"{size / 1024:>10.0f} {blocks[name]:>9} {name}"
                            for name, size in sizes.most_common(_TOP)]  # fmt: skip
        for size, count, trace in sorted(rows, key=lambda r: -r[0])[:top]:
            if key == "traceback":
                lines.append(f"{size / 1024:>10.0f} {count:>9}")
                lines += [f"{'':>21}{f.filename}:{f.lineno}" for f in trace]
            else:
                lines.append(
                    f"{size / 1024:>10.0f} {count:>9} {trace[0].filename}:{trace[0].lineno}"
                )
        return lines


def _types() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def _rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1
