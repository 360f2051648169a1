"""Append one row for a CI run to bench/results/ci_runs.tsv, from `make test`'s saved log.

`.ci/run` tees `make test`'s output to a log and calls this with what only it knows: the
commit, when the run started, the machine, whether the cache existed before, the wall time and
make's exit status. The test counts come from the log: the sum over every pytest summary line
("153 passed, 1 skipped in 1500.2s"). Stdlib only, since `.ci/run` runs it with the system's
python3 before `.venv` exists. It never runs make or pytest, and never rewrites a row already
in the file: the file is the record, and hack/ci_table.py renders it for docs/benchmarks.md.

    python3 -m hack.ci_record --log LOG --commit C --started ISO --machine host/2cpu \
        --cache fresh|cached --seconds S --exit-code RC [--out bench/results/ci_runs.tsv]
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "ci_runs.tsv"
COLUMNS = ("commit", "date", "machine", "cache", "seconds", "result", "passed", "skipped")
HEADER = "\t".join(COLUMNS)
UNKNOWN = "-"


class Cache(enum.StrEnum):
    """Whether `make test` found its cache (`~/.cache/fsdp-operator`) when the run began."""

    FRESH = "fresh"
    CACHED = "cached"


class Result(enum.StrEnum):
    """make's verdict: its exit status, 0 or not."""

    PASSED = "passed"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Counts:
    """Tests passed and skipped, summed over the summary lines read so far."""

    passed: int = 0
    skipped: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(passed=self.passed + other.passed, skipped=self.skipped + other.skipped)


@dataclasses.dataclass(frozen=True)
class Run:
    """One row of the results file; `counts` is None when no summary line was found."""

    commit: str
    date: str
    machine: str
    cache: Cache
    seconds: int
    result: Result
    counts: Counts | None

    def row(self) -> tuple[str, ...]:
        passed = UNKNOWN if self.counts is None else str(self.counts.passed)
        skipped = UNKNOWN if self.counts is None else str(self.counts.skipped)
        cells = (self.commit, self.date, self.machine, self.cache, str(self.seconds))
        return (*cells, self.result, passed, skipped)


# The words pytest's last line counts ("2 failed, 150 passed, 1 skipped, 3 warnings in 9.1s").
# A line counts only when it is made of these items alone, so a test's own output that merely
# mentions "3 passed" is not summed.
_OUTCOMES = "passed|failed|skipped|deselected|xfailed|xpassed|warnings?|errors?|rerun"
_ITEM = rf"\d+ (?:{_OUTCOMES})"
_SUMMARY = re.compile(
    rf"^=*\s*(?P<items>{_ITEM}(?:, {_ITEM})*)"
    r"(?: in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?)?\s*=*$"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def summary_counts(line: str) -> Counts | None:
    """The counts of one pytest summary line; None when the line is not one."""
    match = _SUMMARY.match(_ANSI.sub("", line).strip())
    if match is None:
        return None
    found = dict.fromkeys(("passed", "skipped"), 0)
    for item in match["items"].split(", "):
        number, word = item.split(" ")
        if word in found:
            found[word] += int(number)
    return Counts(passed=found["passed"], skipped=found["skipped"])


def total_counts(lines: Iterable[str]) -> Counts | None:
    """The sum over every summary line (make test prints one per pytest run); None if none."""
    counts = [c for c in map(summary_counts, lines) if c is not None]
    return sum(counts, Counts()) if counts else None


def read(path: Path) -> list[dict[str, str]]:
    """The rows of a results file, oldest first, checking its header is COLUMNS."""
    lines = path.read_text().splitlines()
    if not lines or lines[0] != HEADER:
        raise ValueError(f"{path}: the first line must be the header {HEADER!r}")
    rows = [line.split("\t") for line in lines[1:] if line]
    for number, cells in enumerate(rows, start=2):
        if len(cells) != len(COLUMNS):
            raise ValueError(f"{path}:{number}: {len(cells)} cells, want {len(COLUMNS)}")
    return [dict(zip(COLUMNS, cells, strict=True)) for cells in rows]


def append(path: Path, run: Run) -> None:
    """Add `run` as the file's last row, writing the header first into a new or empty file."""
    cells = run.row()
    bad = [c for c in cells if not c or any(ch in c for ch in "\t\r\n")]
    if bad:
        raise ValueError(f"a cell may not be empty or hold a tab or a newline: {bad!r}")
    if path.exists() and path.stat().st_size:
        read(path)  # refuse to append under a header this script does not write
        text = "\t".join(cells) + "\n"
        if not path.read_text().endswith("\n"):
            text = "\n" + text
    else:
        text = HEADER + "\n" + "\t".join(cells) + "\n"
    with path.open("a") as out:
        out.write(text)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="make test's saved output")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    parser.add_argument("--commit", required=True, help="short hash of HEAD")
    parser.add_argument("--started", required=True, help="UTC ISO 8601 time the run began")
    parser.add_argument("--machine", required=True, help="hostname/<nproc>cpu")
    parser.add_argument("--cache", type=Cache, choices=list(Cache), required=True)
    parser.add_argument("--seconds", type=int, required=True, help="make test's wall time")
    parser.add_argument("--exit-code", type=int, required=True, help="make test's exit status")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    lines = args.log.read_text(errors="replace").splitlines()
    run = Run(
        commit=args.commit,
        date=args.started,
        machine=args.machine,
        cache=args.cache,
        seconds=args.seconds,
        result=Result.PASSED if args.exit_code == 0 else Result.FAILED,
        counts=total_counts(lines),
    )
    append(args.out, run)
    print(f"{args.out}: " + " ".join(f"{k}={v}" for k, v in zip(COLUMNS, run.row(), strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
