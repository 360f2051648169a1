"""Where the operator's memory goes, for the person sizing it.

Start the operator with ``FSDPOP_HEAP_REPORT=<file>``; each SIGUSR2 then writes a report to
``<file>.<n>`` of what grew since the previous one (the first compares with nothing): RSS,
Python's allocator (pymalloc arenas: in use, free inside) and glibc's (in use, free but kept),
live objects by type with their own sizes (strings and numbers they hold counted once), and
dicts by their keys, which names the structure that grew (a slimmed pod, a kopf body). Signal
once idle and once with the jobs running: the second report is the cost of the jobs. Objects
are walked only when signalled (seconds at a thousand jobs).

``FSDPOP_HEAP_FRAMES=<n>`` also traces every allocation (tracemalloc, n frames each) and adds
growth by package, source line and call stack; that makes the operator several times slower, so
use it at a few hundred jobs, and never quote a traced run's RSS.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import dataclasses
import gc
import logging
import os
import re
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

_TOP = 40


def install(path: str, frames: int = 0) -> bool:
    """Write a heap report to `path`.<n> on each SIGUSR2 (tracing allocations with `frames`
    frames when > 0); False when `path` is empty."""
    if not path:
        return False
    if frames > 0 and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    reporter = _Reporter(Path(path))
    signal.signal(signal.SIGUSR2, reporter.on_signal)
    log.info("heap reports on SIGUSR2 to %s.<n>", path)
    return True


def trim() -> bool:
    """Hand the free pages glibc keeps back to the kernel (malloc_trim); False where there is no
    glibc. A bring-up's peak (watch streams, parsed bodies, passes on 30-odd threads) leaves
    free memory scattered through the heap, which glibc's own trimming (the heap's top only)
    never returns: 37 MiB of RSS at 1,000 jobs, a third of their cost, was memory freed but
    kept."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.malloc_trim(0))


async def trim_every(seconds: float) -> None:
    """trim() every `seconds` (it takes milliseconds; RSS then follows what is held)."""
    while True:
        await asyncio.sleep(seconds)
        started = time.monotonic()
        trim()
        log.debug("malloc_trim took %.1f ms", 1000 * (time.monotonic() - started))


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
        self.last_census: Census | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        try:
            self.write()
        except Exception:  # a report is a diagnostic: never take the operator down
            log.exception("heap report failed")

    def write(self) -> None:
        started = time.monotonic()
        gc.collect()
        self.count += 1
        out = Path(f"{self.path}.{self.count}")
        census = Census.take()
        was = self.last_census
        before = was.memory if was else {}
        lines = [
            f"heap report {self.count} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
            f"compared_with {'report ' + str(self.count - 1) if was else 'nothing'}",
            "",
            "== memory (KiB): now, growth ==",
            *(
                f"{key:<26} {value // 1024:>10} {(value - before.get(key, 0)) // 1024:>10}"
                for key, value in census.memory.items()
            ),
            "",
            "== objects by type: growth in KiB (own size), count; then now ==",
            *census.growth(was, "types"),
            "",
            "== dicts by keys: growth in KiB, count ==",
            *census.growth(was, "shapes"),
        ]
        if tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            lines += self._growth(snap, "filename", by_package=True)
            lines += self._growth(snap, "lineno")
            lines += self._growth(snap, "traceback", top=15)
            self.last = snap
        lines.append(f"\n(written in {time.monotonic() - started:.1f} s)")
        out.write_text("\n".join(lines) + "\n")
        self.last_census = census
        log.info("heap report written to %s", out)

    def _growth(
        self, snap: tracemalloc.Snapshot, key: str, *, by_package: bool = False, top: int = _TOP
    ) -> list[str]:
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
            return lines + [
                f"{size / 1024:>10.0f} {blocks[name]:>9} {name}"
                for name, size in sizes.most_common(_TOP)
            ]
        for size, count, trace in sorted(rows, key=lambda r: -r[0])[:top]:
            if key == "traceback":
                lines.append(f"{size / 1024:>10.0f} {count:>9}")
                lines += [f"{'':>21}{f.filename}:{f.lineno}" for f in trace]
            else:
                lines.append(
                    f"{size / 1024:>10.0f} {count:>9} {trace[0].filename}:{trace[0].lineno}"
                )
        return lines


_Tally = dict[str, list[int]]  # name -> [bytes, count]


@dataclasses.dataclass
class Census:
    """Live objects by type and dicts by keys, with the allocators' totals, at one moment."""

    memory: dict[str, int]
    types: _Tally
    shapes: _Tally

    @classmethod
    def take(cls) -> Census:
        types: _Tally = collections.defaultdict(lambda: [0, 0])
        shapes: _Tally = collections.defaultdict(lambda: [0, 0])

        def count(obj: object) -> None:
            size = sys.getsizeof(obj)
            _tally(types, type(obj).__qualname__, size)
            if type(obj) is dict:
                _tally(shapes, _shape(obj), size)

        # The collector lists tracked objects only: strings, numbers, and dicts and tuples that
        # hold nothing else are reached through what holds them, each counted once.
        seen: set[int] = set()
        for obj in gc.get_objects():
            count(obj)
            stack = [r for r in gc.get_referents(obj) if not gc.is_tracked(r)]
            while stack:
                ref = stack.pop()
                if id(ref) in seen:
                    continue
                seen.add(id(ref))
                count(ref)
                if isinstance(ref, dict | tuple):
                    stack += [r for r in gc.get_referents(ref) if not gc.is_tracked(r)]
        return cls(memory=_memory(), types=dict(types), shapes=dict(shapes))

    def growth(self, was: Census | None, field: str) -> list[str]:
        now: _Tally = getattr(self, field)
        old: _Tally = getattr(was, field) if was else {}
        diff = {
            k: (v[0] - old.get(k, [0, 0])[0], v[1] - old.get(k, [0, 0])[1]) for k, v in now.items()
        }
        top = sorted(diff.items(), key=lambda kv: -kv[1][0])[:_TOP]
        return [
            f"{b / 1024:>10.0f} {n:>9}   {now[k][0] / 1024:>10.0f} {now[k][1]:>9}  {k}"
            for k, (b, n) in top
        ]


def _tally(into: _Tally, key: str, size: int) -> None:
    entry = into[key]
    entry[0] += size
    entry[1] += 1


def _shape(d: dict[Any, Any]) -> str:
    """A dict's keys when they are names (a record's fields), else their types and number (a
    table)."""
    keys = list(d)
    if len(keys) <= 24 and all(type(k) is str for k in keys):
        return "{" + ", ".join(sorted(keys))[:160] + "}"
    kinds = sorted({type(k).__qualname__ for k in keys})
    at_least = 10 ** (len(str(len(keys))) - 1)  # 25 keys: 10+, 1,000: 1000+
    return f"{{{at_least}+ keys of {', '.join(kinds)[:60]}}}"


def _memory() -> dict[str, int]:
    """RSS, pymalloc's arenas (mapped, in live blocks) and glibc malloc's (in use, free but
    kept, mmapped), in bytes."""
    out = {"rss": _rss_kib() * 1024}
    stats = _pymalloc_stats()
    arenas = re.search(r"^(\d+) arenas \* (\d+) bytes/arena", stats, re.M)
    used = re.search(r"^# bytes in allocated blocks\s*=\s*([\d,]+)", stats, re.M)
    if arenas and used:
        out["pymalloc arenas"] = int(arenas[1]) * int(arenas[2])
        out["pymalloc in live blocks"] = int(used[1].replace(",", ""))
    out |= _mallinfo()
    if tracemalloc.is_tracing():
        out["traced"], out["traced peak"] = tracemalloc.get_traced_memory()
    return out


def _pymalloc_stats() -> str:
    """sys._debugmallocstats() writes to C's stderr: catch it in a file."""
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> dict[str, int]:
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return {}
    fn.restype = _MallInfo2
    got = fn()
    return {
        "malloc in use": got.uordblks,
        "malloc free, kept": got.fordblks,
        "malloc mmapped": got.hblkhd,
    }


def _rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1
